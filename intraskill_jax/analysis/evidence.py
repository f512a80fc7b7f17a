"""Chapters 4-6: results (the four conditions, paired intervals, McNemar, gates round by round, skill
evolution, missing controls and open questions), behaviour (the explorer and example cases with
their traces), optimisation (the trainer's logs). Words from the catalogue (`ch<N>.*`), numbers
from figures.json."""

from __future__ import annotations

import json

from intraskill_jax.analysis.behaviour import BEHAVIOUR_FIELDS
from intraskill_jax.analysis.chapters import render_trace
from intraskill_jax.analysis.front import condition_cells, outcome_fmt, outcome_heads
from intraskill_jax.analysis.results import OUTCOMES
from intraskill_jax.analysis.site import Page, chapter_head, code, esc, pointer
from intraskill_jax.analysis.training import BANK_ACTIONS, FUNNEL_STAGES, OPTIMISATION_METRICS

# -- 04 results -----------------------------------------------------------------------------------


def results(page: Page) -> None:
    chapter_head(page, 4)
    _conditions(page)
    _comparisons(page)
    _gates(page)
    _skills(page)
    _controls(page)


def _conditions(page: Page) -> None:
    table = page.figures["conditions"]
    page.section("conditions", "ch4.conditions_title")
    if not table:
        page.empty("eval.none")
        return
    page.add(page.paras("ch4.conditions"))
    page.table(
        [page.t("col.condition"), page.t("col.model"), page.t("col.guidance"), page.t("col.tasks"),
         *outcome_heads(page), page.t("col.successes")],
        ([code(r["condition"]), *condition_cells(page, i, r), page.num("int", "conditions", i, "n"),
          *(page.num(outcome_fmt(o), "conditions", i, o) for o in OUTCOMES),
          page.num("int", "conditions", i, "successes")] for i, r in enumerate(table)),
        "conditions",
    )
    page.plot("conditions", "fig.conditions")


def _diff(page: Page, i: int, name: str) -> str:
    return (f'{page.num("+f3", "comparisons", i, f"{name}_diff")} '
            f'[{page.num("+f3", "comparisons", i, f"{name}_ci_low")}, '
            f'{page.num("+f3", "comparisons", i, f"{name}_ci_high")}]')


def _comparisons(page: Page) -> None:
    comps = page.figures["comparisons"]
    if not comps:
        return
    page.section("paired", "ch4.paired_title")
    page.add(page.paras("ch4.paired"))
    page.table(
        [page.t("col.pair"), page.t("col.tasks"), page.t("col.newly"), page.t("col.regress"), page.t("col.both_ok"),
         page.t("col.both_fail"), *(page.t("col.diff", outcome=h) for h in outcome_heads(page)), page.t("col.mcnemar")],
        ([f"{code(c['a'])} − {code(c['b'])}", page.num("int", "comparisons", i, "n"),
          page.num("int", "comparisons", i, "newly_succeed"), page.num("int", "comparisons", i, "regress"),
          page.num("int", "comparisons", i, "both_succeed"), page.num("int", "comparisons", i, "both_fail"),
          *(_diff(page, i, o) for o in OUTCOMES), page.num("g4", "comparisons", i, "mcnemar_p")]
         for i, c in enumerate(comps)),
        "comparisons",
    )
    page.plot("flips", "fig.flips")


def _gates(page: Page) -> None:
    gates = page.figures["gates"]
    page.section("gates", "ch4.gates_title")
    if not gates:
        page.empty("ch4.no_gate")
        return
    page.add(page.paras("ch4.gates"))
    g = "gates"
    page.table(
        [page.t("col.round"), page.t("col.step"), page.t("col.tasks"), page.t("col.bare"), page.t("col.random"),
         page.t("col.full"), page.t("col.gain"), page.t("col.mcnemar"), page.t("col.additivity")],
        ([page.num("int", g, i, "round"), page.num("int", g, i, "step"), page.maybe("int", g, i, "n"),
          page.maybe("f3", g, i, "bare_reward"), page.maybe("f3", g, i, "random_reward"), page.maybe("f3", g, i, "full_reward"),
          f'{page.maybe("+f3", g, i, "gain_reward")} [{page.maybe("+f3", g, i, "gain_reward_ci_low")}, '
          f'{page.maybe("+f3", g, i, "gain_reward_ci_high")}]',
          page.maybe("g4", g, i, "mcnemar_p"), page.maybe("+f3", g, i, "additivity_difference")]
         for i in range(len(gates))),
        "gates",
    )
    rounds = page.figures["rounds"]
    page.add(f"<h3>{page.t('ch4.bank_title')}</h3><p>{page.t('ch4.bank')}</p>")
    page.table(
        [page.t("col.gate"), page.t("col.step"), page.t("col.new_bank"),
         *(page.t(f"col.{a}") for a in BANK_ACTIONS), page.t("col.active"), page.t("col.evidence")],
        ([page.num("int", "rounds", i, "round"), page.num("int", "rounds", i, "step"),
          code(r["skill"]) if r["skill"] else page.t("ch4.not_written"),
          *(page.maybe("int", "rounds", i, f"n_{a}") for a in BANK_ACTIONS), page.maybe("int", "rounds", i, "active"),
          _evidence(page, r)] for i, r in enumerate(rounds)),
        "rounds",
    )
    page.add(f"<h3>{page.t('ch4.funnel_title')}</h3><p>{page.t('ch4.funnel')}</p>")
    page.table(
        [page.t("col.round"), *(page.t(f"funnel.{s}") for s in FUNNEL_STAGES)],
        ([page.num("int", "funnel", i, "round"), *(page.maybe("int", "funnel", i, s) for s in FUNNEL_STAGES)]
         for i in range(len(page.figures["funnel"]))),
        "funnel",
    )
    page.plot("funnel", "fig.funnel")


def _evidence(page: Page, row: dict) -> str:
    if row["informative"] is None:
        return page.t("evidence.unknown")
    reason = esc(row["evidence"]) if row["evidence"] else ""
    return page.t("evidence.yes" if row["informative"] else "evidence.no", reason=reason)


def _skills(page: Page) -> None:
    page.section("skills", "ch4.skills_title")
    skills = page.data.skills
    if not skills:
        page.empty("ch4.no_skills")
        return
    page.add(page.paras("ch4.skills"))
    page.table(
        [page.t("col.round"), page.t("col.skill"), page.t("col.active"), page.t("col.retired_total"),
         *(page.t(f"col.{a}") for a in BANK_ACTIONS)],
        ([page.num("int", "skills", i, "round"), code(s["name"]), page.num("int", "skills", i, "active"),
          page.num("int", "skills", i, "retired"), *(page.num("int", "skills", i, f"n_{a}") for a in BANK_ACTIONS)]
         for i, s in enumerate(page.figures["skills"])),
        "skill-rounds",
    )
    page.plot("contributions", "fig.contributions")
    estimates = {(r["round"], r["column"]): i for i, r in enumerate(page.figures["contributions"])}
    page.add('<nav class="rounds">' + " ".join(
        f'<a href="#round-{int(s["round"])}">{page.t("ch4.round_link", n=esc(s["round"]))}</a>' for s in skills) + "</nav>")
    # The page's language first, the other beside it; each text verbatim as the bank holds it.
    langs = (page.lang, *(x for x in ("en", "zh") if x != page.lang))
    for s in skills:
        k = int(s["round"])
        page.add(f'<section class="round" id="round-{k}"><h3>{page.t("ch4.round_title", n=str(k), name=code(s["name"]))}</h3>')
        if s.get("ledger"):
            page.add(f"<details><summary>{page.t('ch4.ledger', prev=str(k - 1))}</summary><ul>")
            page.add(*(f"<li><b>{_action(page, e['action'])}</b> {code(e['chunk_id'])}: {esc(e['reason'])}</li>"
                       for e in s["ledger"]))
            page.add("</ul></details>")
        for c in s["chunks"]:
            j = estimates.get((k, c["id"]))
            if j is None:
                last = k == len(skills) - 1 and k >= len(page.figures["gates"])
                estimate = page.t("ch4.final_bank" if last else "ch4.not_tested", n=str(k))
            else:
                p = ("contributions", j)
                estimate = page.t("ch4.estimate", n=str(k), beta=page.num("+f3", *p, "beta"), low=page.maybe("+f3", *p, "ci_low"),
                                  high=page.maybe("+f3", *p, "ci_high"), action=_action(page, page.figures["contributions"][j]["action"]))
            status = page.t(f"status.{c['status']}") if f"status.{c['status']}" in page.text else esc(c["status"])
            texts = "".join(f'<div class="text" lang="{x}" data-lang="{x}">{esc(c[x])}</div>' for x in langs)
            page.add(
                f'<article class="chunk {esc(c["status"])}" data-round="{k}" data-chunk="{esc(c["id"])}">'
                f'<h4>{code(c["id"])} {esc(c["title"])} <small>{status}, {page.t("ch4.revision", n=esc(c["revision"]))}; {estimate}</small></h4>'
                f'<div class="texts">{texts}</div></article>'
            )
        page.add("</section>")


def _action(page: Page, action: str | None) -> str:
    """A gate decision (retain, rewrite, add, retire, reject, superseded) in the page's language."""
    key = f"action.{action}"
    return page.t(key) if key in page.text else esc(action or "")


def _controls(page: Page) -> None:
    page.section("controls", "ch4.controls_title")
    page.add(page.paras("ch4.controls"))
    items = []
    for i, c in enumerate(page.figures["controls"]):
        items.append(page.t(f"control.{c['id']}.{'this' if c['this_run'] else 'open'}"))
    i = page.value("headline", "training")
    if i is not None:
        c = ("comparisons", i)
        items.append(page.t("question.interval", points=page.num("+pp2", *c, "success_diff"),
                            low=page.num("+pp2", *c, "success_ci_low"), high=page.num("+pp2", *c, "success_ci_high"),
                            tasks=page.num("int", *c, "n")))
    silent = [r for r in page.figures["rounds"] if r["informative"] is False]
    if silent:
        items.append(page.t("question.evidence", n=str(len(silent)), rounds=page.num("int", "run", "rounds_closed")))
    items += page.items("question.always")
    if page.data.problems:
        items.append(page.t("question.problems", n=page.num("int", "run", "problems"), link=page.a("index", "problems", "link.problems")))
    page.add('<ul class="open">', *(f"<li>{x}</li>" for x in items), "</ul>")


# -- 05 behaviour ---------------------------------------------------------------------------------


def behaviour(page: Page) -> None:
    chapter_head(page, 5)
    page.section("explorer", "ch5.explorer_title")
    page.add(page.paras("ch5.explorer"))
    rows = []
    beh = page.figures["behaviour"]
    for i, r in enumerate(beh["by_condition"]):
        rows.append({"source": "test", "group": r["condition"], "outcome": r["outcome"],
                     "pointer": pointer("behaviour", "by_condition", i), "values": {f: r[f] for f in ("n", *BEHAVIOUR_FIELDS)}})
    for i, r in enumerate(beh["by_checkpoint"]):
        group = catalog_group(page, r["round"], r["arm"])
        rows.append({"source": "validation", "group": group, "outcome": r["outcome"],
                     "pointer": pointer("behaviour", "by_checkpoint", i), "values": {f: r[f] for f in ("n", *BEHAVIOUR_FIELDS)}})
    labels = {"test": page.t("explorer.test"), "validation": page.t("explorer.validation"),
              **{o: page.t(f"outcome.{o}") for o in ("all", "success", "failure")}}
    options = lambda pairs: "".join(f'<option value="{v}">{page.t(k)}</option>' for v, k in pairs)  # noqa: E731
    page.add(
        '<form id="filters" class="filters">'
        f'<label>{page.t("explorer.source")} <select id="f-source">'
        + options((("all", "explorer.all"), ("test", "explorer.test"), ("validation", "explorer.validation")))
        + f'</select></label> <label>{page.t("explorer.outcome")} <select id="f-outcome">'
        + options((("all", "explorer.all_episodes"), ("success", "explorer.successes"), ("failure", "explorer.failures"),
                   ("split", "explorer.split")))
        + f'</select></label> <label>{page.t("explorer.group")} <input id="f-group" type="search" '
        f'placeholder="{page.t("explorer.placeholder")}"></label></form>'
        '<div class="scroll"><table id="explorer"><thead><tr>'
        f'<th>{page.t("explorer.source")}</th><th>{page.t("explorer.group_head")}</th><th>{page.t("explorer.outcome")}</th>'
        f'<th>{page.t("col.episodes")}</th>' + "".join(f"<th>{page.t(f'field.{f}')}</th>" for f in BEHAVIOUR_FIELDS)
        + f'</tr></thead><tbody></tbody></table></div><p id="explorer-empty" class="empty" hidden>{page.t("explorer.empty")}</p>'
    )
    payload = {"fields": list(BEHAVIOUR_FIELDS), "rows": rows, "labels": labels}
    # "</" inside a script element would end it early; JSON allows the escaped form.
    page.add('<script type="application/json" id="behaviour-data">'
             + json.dumps(payload, ensure_ascii=False).replace("</", "<\\/") + "</script>")
    page.add(f'<p class="note">{page.t("ch5.measures")}</p>')
    page.plot("behaviour", "fig.behaviour")
    page.plot("behaviour_checkpoints", "fig.behaviour_checkpoints")
    _cases(page)


def catalog_group(page: Page, round_: int, arm: str) -> str:
    """A validation group's name in the page's language: 'round 1 / random'."""
    return f"{page.t('ch4.round_link', n=str(round_))} / {arm}"


def _cases(page: Page) -> None:
    page.section("cases", "ch5.cases_title")
    traces = page.data.traces
    if not traces:
        page.empty("ch2.no_trace")
        return
    page.add(page.paras("ch5.cases", link=page.a("task", "trace", "nav.task")))
    page.table(
        [page.t("col.condition"), page.t("col.task"), page.t("col.outcome"), page.t("col.turns"),
         page.t("col.generated"), page.t("col.reward"), ""],
        ([code(t["condition"]), page.num("int", "traces", k, "task_id"),
          page.t("outcome.success" if t["success"] else "outcome.failure"), esc(len(t["transcript"])),
          page.maybe("int", "traces", k, "generated_tokens"), page.num("f3", "traces", k, "reward"),
          f'<a href="#trace-{k}">{page.t("ch5.read_trace")}</a>'] for k, t in enumerate(traces)),
        "cases",
    )
    for k in range(len(traces)):
        render_trace(page, k, open_=False)


# -- 06 optimisation ------------------------------------------------------------------------------


def optimisation(page: Page) -> None:
    chapter_head(page, 6)
    final = page.figures["training"]["final"]
    page.section("logs", "ch6.logs_title")
    if not final:
        page.empty("front.no_training")
        return
    page.add(page.paras("ch6.logs", steps=page.num("int", "run", "steps"),
                        updated=page.maybe("int", "training_funnel", "steps_updated"),
                        logged=page.maybe("int", "training_funnel", "steps_with_update")))
    if not any(m.startswith("train/") and m in final for m in OPTIMISATION_METRICS):
        page.empty("ch6.no_update")
    page.plot("optimisation", "fig.optimisation")
    shown = [m for m in OPTIMISATION_METRICS if m in final]
    page.table([page.t("col.metric"), page.t("col.what"), page.t("col.step"), page.t("col.last"), page.t("col.mean5")],
               ([code(m), page.t(f"metric.{m}"), page.num("int", "training", "final", m, "step"),
                 page.num("g4", "training", "final", m, "raw"), page.num("g4", "training", "final", m, "mean")]
                for m in shown), "metrics")
    page.section("groups", "ch6.groups_title")
    page.add(page.paras("ch6.groups"))
    n = len(page.figures["groups"])
    page.table(
        [page.t("col.step"), page.t("col.groups"), page.t("col.episodes"), page.t("col.zero_var"),
         page.t("col.retried"), page.t("col.skill_free"), page.t("col.admitted")],
        ([page.num("int", "groups", i, "step"), page.num("int", "groups", i, "groups"),
          page.num("int", "groups", i, "episodes"), page.num("pct1", "groups", i, "zero_variance_share"),
          page.num("pct1", "groups", i, "retry_share"), page.num("pct1", "groups", i, "skill_free_share"),
          page.maybe("pct1", "groups", i, "admitted_share")] for i in range(n)),
        "groups",
    )
    page.section("last", "ch6.last_title")
    names = [m for m in page.figures["training"]["headline"] if m in final]
    names += [m for m in sorted(final) if m not in names]
    page.add(f"<details id=\"last-values\"><summary>{page.t('ch6.last', n=str(len(names)))}</summary>")
    page.table([page.t("col.metric"), page.t("col.step"), page.t("col.last"), page.t("col.mean5")],
               ([code(m), page.num("int", "training", "final", m, "step"), page.num("g4", "training", "final", m, "raw"),
                 page.num("g4", "training", "final", m, "mean")] for m in names), "metrics")
    page.add("</details>")
