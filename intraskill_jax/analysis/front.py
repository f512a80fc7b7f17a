"""The front page: the headline (test success without skills, base -> trained), the key counts, a
reading guide into the seven chapters, the four test conditions, the flips, what the final skill
adds, and the training curve. Words from the catalogue (`front.*`), numbers from figures.json."""

from __future__ import annotations

from typing import Any

from intraskill_jax.analysis.results import OUTCOMES
from intraskill_jax.analysis.site import PAGES, Page, esc, run_name

CHAPTERS = [name for name, _ in PAGES[1:]]


def front_page(page: Page) -> None:
    page.add(f'<section class="hero"><p class="eyebrow">{page.t("front.eyebrow")}</p>'
             f'<h1>{page.t("site.name")}<span class="sub">{page.t("front.subtitle")}</span></h1>'
             f'<p class="tagline">{page.t("front.tagline", run=esc(run_name(page.data)))}</p>')
    _headline(page)
    _counts(page)
    page.add("</section>")
    problems(page)
    _guide(page)
    _evaluation(page)
    _training(page)


def model_label(page: Page) -> str:
    """The policy's model as recorded: its HF model_type (or architecture) and parameter count."""
    model = page.data.provenance.get("model") or {}
    config = model.get("config") or {}
    kind = config.get("model_type") or (config.get("architectures") or [None])[0]
    if kind and model.get("parameters") is not None:
        return page.t("front.model", kind=esc(kind), params=page.num("si", "run", "parameters"))
    return esc(kind) if kind else page.t("front.model_unknown")


def _headline(page: Page) -> None:
    i = page.value("headline", "training")
    page.add(f'<div class="headline" id="headline"><p class="label">{page.t("front.headline_label")}</p>')
    if i is None:
        page.add(f'<p class="empty">{page.t("front.no_headline" if page.figures["conditions"] else "eval.none")}</p></div>')
        return
    c = ("comparisons", i)
    diff = page.value(*c, "success_diff") or 0.0
    trend, arrow = ("up", "↗") if diff > 0 else ("down", "↘") if diff < 0 else ("flat", "→")
    page.add(
        f'<p class="big {trend}"><span class="from">{page.num("pct2", *c, "success_b")}</span>'
        f'<span class="arrow" aria-hidden="true">{arrow}</span><span class="to">{page.num("pct2", *c, "success_a")}</span></p>'
        f'<p class="who">{page.t("front.headline_who", model=model_label(page), step=page.maybe("int", "run", "last_step"))}</p>'
        f'<p class="delta {trend}">{page.t("front.headline_delta", points=page.num("+pp2", *c, "success_diff"))}</p>'
        f'<p class="scope">{page.t("front.headline_scope", tasks=page.num("int", *c, "n"), runs=page.num("int", "run", "training_runs"))}</p>'
        "</div>"
    )


def _counts(page: Page) -> None:
    cells = [
        (page.maybe("si", "run", "parameters"), "front.count_parameters"),
        (page.num("int", "run", "steps"), "front.count_steps"),
        (page.num("int", "run", "rounds_closed"), "front.count_rounds"),
        (f'{page.maybe("int", "run", "initial_chunks")} → {page.maybe("int", "run", "final_chunks")}',
         "front.count_chunks"),
    ]
    page.add('<dl class="counts">', *(f"<div><dt>{v}</dt><dd>{page.t(k)}</dd></div>" for v, k in cells), "</dl>")


def problems(page: Page) -> None:
    """The records the run directory lacked or had damaged (problems.json), if any."""
    if not page.data.problems:
        return
    page.section("problems", "front.problems_title")
    page.add(f"<p>{page.t('front.problems_lead')}</p><ul class=\"problems\">")
    page.add(*(f"<li><code>{esc(p['path'])}</code> ({esc(p['kind'])}): {esc(p['message'])}</li>"
               for p in page.data.problems))
    page.add("</ul>")


def _guide(page: Page) -> None:
    page.section("guide", "front.guide_title")
    page.add(f"<p>{page.t('front.guide_lead')}</p><div class=\"guide\">")
    for k, name in enumerate(CHAPTERS, start=1):
        page.add(f'<a class="card" href="{page.link(name)}"><span class="no">{k:02d} / {page.t(f"ch{k}.eyebrow")}</span>'
                 f'<strong>{page.t(f"ch{k}.question")}</strong><span>{page.t(f"ch{k}.summary")}</span></a>')
    page.add("</div>")


def condition_cells(page: Page, i: int, row: dict[str, Any]) -> list[str]:
    """Model and guidance of condition row `i` in words."""
    policy = row["policy"]
    model = page.t(f"cond.policy.{policy}") if policy in ("base", "trained", "pretrained") else esc(policy)
    if row["skill"] in (None, "none"):
        guidance = page.t("cond.skill.none")
    elif row["condition"] in ("base_skill", "pretrained_skill"):
        guidance = page.t("cond.skill.initial", name=f"<code>{esc(row['skill'])}</code>")
    elif row["condition"] == "trained_skill":
        guidance = page.t("cond.skill.final", name=f"<code>{esc(row['skill'])}</code>")
    else:
        guidance = f"<code>{esc(row['skill'])}</code>"
    return [model, guidance]


def outcome_heads(page: Page) -> list[str]:
    reward = page.figures["run"].get("reward")
    return [page.t("col.reward_named", name=esc(reward)) if reward else page.t("col.reward"),
            page.t("col.strict"), page.t("col.success")]


def outcome_fmt(name: str) -> str:
    return "pct1" if name == "success" else "f3"


def _evaluation(page: Page) -> None:
    table = page.figures["conditions"]
    page.section("evaluation", "front.eval_title")
    if not table:
        page.empty("eval.none")
        return
    page.add(f"<p>{page.t('front.eval_lead', tasks=page.num('int', 'conditions', 0, 'n'))}</p>")
    page.table(
        [page.t("col.model"), page.t("col.guidance"), *outcome_heads(page)],
        ([*condition_cells(page, i, r), *(page.num(outcome_fmt(o), "conditions", i, o) for o in OUTCOMES)]
         for i, r in enumerate(table)),
        "conditions headline",
    )
    page.add('<div class="findings">')
    i = page.value("headline", "training")
    if i is not None:
        c = ("comparisons", i)
        title = page.t_count("front.flips_title", page.value(*c, "newly_succeed"), newly=page.num("int", *c, "newly_succeed"))
        page.add(f'<div class="finding" id="flips"><h3>{title}</h3>'
                 f'<p>{page.t("front.flips_text", newly=page.num("int", *c, "newly_succeed"), regress=page.num("int", *c, "regress"), same_ok=page.num("int", *c, "both_succeed"), same_fail=page.num("int", *c, "both_fail"))}</p></div>')
    j = page.value("headline", "final_skill")
    if j is not None:
        c = ("comparisons", j)
        key = "front.skill_title" if (page.value(*c, "success_diff") or 0.0) > 0 else "front.skill_title_not_up"
        page.add(f'<div class="finding" id="final-skill"><h3>{page.t(key, points=page.num("+pp2", *c, "success_diff"))}</h3>'
                 f'<p>{page.t("front.skill_text", low=page.num("+pp2", *c, "success_ci_low"), high=page.num("+pp2", *c, "success_ci_high"), link=page.a("results", "controls", "link.controls"))}</p></div>')
    page.add("</div>")


def _training(page: Page) -> None:
    f = page.figures["training_funnel"]
    page.section("training", "front.training_title")
    if not f["steps"]:
        page.empty("front.no_training")
        return
    page.add(f"<p>{page.t('front.training_lead', steps=page.num('int', 'run', 'steps'), rounds=page.num('int', 'run', 'rounds_closed'), generated=page.maybe('int', 'training_funnel', 'episodes_generated'), admitted=page.maybe('int', 'training_funnel', 'episodes_admitted'), share=page.maybe('pct1', 'training_funnel', 'admitted_share'))}</p>")
    page.plot("training", "fig.training")
    page.add(f'<p class="note">{page.t("front.training_note")}</p>')
