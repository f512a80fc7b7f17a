"""The static report site: plain HTML, one CSS and one JS file, no network (works from file://).

Pages: overview (first the headline the terminal summary prints: the test conditions, the paired
differences, what the bank did at each gate and the training funnel; then the run, training
dynamics, gates), results (conditions and paired comparisons in full), behaviour explorer
(client-side filtering of figures embedded as JSON), skill evolution (each chunk's text per round
in English and Chinese, with its estimate and the ledger).

Every number on a page comes from the bundle's figures.json and carries its JSON pointer and
format, `<span data-fig="/conditions/0/success" data-fmt="pct1">72.5%</span>`, so a test (or a
reader) can check each one against the bundle.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from etils import epath

from intraskill_jax import rundir
from intraskill_jax.analysis.behaviour import BEHAVIOUR_FIELDS
from intraskill_jax.analysis.bundle import BundleData, load_bundle
from intraskill_jax.analysis.results import OUTCOMES, reward_label
from intraskill_jax.analysis.training import BANK_ACTIONS, FUNNEL_STAGES, describe_evidence

PAGES = (
    ("index.html", "Overview"),
    ("results.html", "Results"),
    ("behaviour.html", "Behaviour"),
    ("skills.html", "Skill evolution"),
)
OUTCOME_HEADS = {"strict": "strict reward", "success": "success"}  # the run's reward: reward_label
_NO_EVALUATION = ('<p class="empty">No evaluation yet: <code>eval/outcomes.jsonl</code> was absent when the '
                  "bundle was built. Run <code>intraskill eval</code>, then the report again.</p>")
FIELD_LABELS = {
    "tokens_per_turn": "tokens / turn",
    "turns": "model steps",
    "searches": "searches",
    "product_visits": "product visits",
    "repairs": "repairs",
}
ASSETS = Path(__file__).with_name("site_assets")


def fmt_value(value: Any, fmt: str) -> str:
    """How a figure is written on the page; `fmt` is one of int, f2, f3, +f3, pct1, g4."""
    if value is None:
        return "–"
    if fmt == "int":
        return str(int(value))
    if fmt == "pct1":
        return f"{100 * value:.1f}%"
    if fmt == "g4":
        return format(value, ".4g")
    if fmt.startswith("+f"):
        return format(value, f"+.{fmt[2:]}f")
    if fmt.startswith("f"):
        return format(value, f".{fmt[1:]}f")
    raise ValueError(f"unknown number format {fmt!r}")


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) into figures.json; metric names contain '/', escaped as ~1."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def resolve(figures: Any, ptr: str) -> Any:
    """The value a JSON pointer names."""
    node = figures
    for raw in ptr.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


class _Page:
    """Builds one page's HTML, writing each number from figures.json with its pointer."""

    def __init__(self, figures: Mapping[str, Any]):
        self.figures = figures
        self.parts: list[str] = []

    def num(self, fmt: str, *path: str | int) -> str:
        ptr = pointer(*path)
        value = resolve(self.figures, ptr)
        return f'<span class="num" data-fig="{ptr}" data-fmt="{fmt}">{fmt_value(value, fmt)}</span>'

    def add(self, *chunks: str) -> None:
        self.parts.extend(chunks)

    def table(self, head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> None:
        """Cells are HTML already (numbers via `num`, text via `esc`)."""
        self.add(f'<table class="{cls}"><thead><tr>')
        self.add(*(f"<th>{h}</th>" for h in head))
        self.add("</tr></thead><tbody>")
        for row in rows:
            self.add("<tr>", *(f"<td>{c}</td>" for c in row), "</tr>")
        self.add("</tbody></table>")


def esc(x: Any) -> str:
    return html.escape(str(x))


def build_site(bundle_dir: rundir.PathLike, out_dir: rundir.PathLike) -> epath.Path:
    """Writes the site into `out_dir` (plots, if any, are expected in `out_dir/plots/`); returns
    the path of index.html."""
    data = load_bundle(bundle_dir)
    if data.figures is None:
        raise ValueError(f"{bundle_dir} has no figures.json; rebuild it with build_bundle")
    out = rundir.run_path(out_dir)
    for asset in ("site.css", "explorer.js"):
        rundir.write_bytes(out / "assets" / asset, (ASSETS / asset).read_bytes())
    plots = {p.stem for p in (out / "plots").glob("*.svg")} if (out / "plots").is_dir() else set()
    builders = {
        "index.html": _overview,
        "results.html": _results,
        "behaviour.html": _behaviour,
        "skills.html": _skills,
    }
    for name, title in PAGES:
        page = _Page(data.figures)
        builders[name](page, data, plots)
        rundir.write_text(out / name, _frame(name, title, data, "".join(page.parts)))
    return out / "index.html"


def _frame(name: str, title: str, data: BundleData, body: str) -> str:
    here = ' class="here" aria-current="page"'
    nav = " ".join(
        f'<a href="{href}"{here if href == name else ""}>{esc(t)}</a>' for href, t in PAGES
    )
    script = '<script src="assets/explorer.js"></script>' if name == "behaviour.html" else ""
    run_name = data.config.get("name") or data.root.parent.name
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request, so no 404 in the console
        f"<title>{esc(title)} · IntraSkill report · {esc(run_name)}</title>"
        '<link rel="stylesheet" href="assets/site.css"></head><body>'
        f'<header><h1>IntraSkill report <small>{esc(run_name)}</small></h1><nav>{nav}</nav></header>'
        f"<main>{body}</main>"
        '<footer>Built from the bundle in <code>'
        f"{esc(data.root)}</code>; every number is read from its figures.json. "
        "Check it with <code>intraskill check-bundle</code>.</footer>"
        f"{script}</body></html>\n"
    )


def _plot(page: _Page, plots: set[str], name: str, caption: str) -> None:
    if name in plots:
        page.add(
            f'<figure><a href="plots/{name}.svg"><img src="plots/{name}.svg" alt="{esc(caption)}"></a>'
            f'<figcaption>{esc(caption)} (<a href="plots/{name}.png">PNG</a>)</figcaption></figure>'
        )


# -- pages ------------------------------------------------------------------------------------


def _overview(page: _Page, data: BundleData, plots: set[str]) -> None:
    _headline(page, data)
    if data.problems:
        page.add('<h2>Incomplete or damaged records</h2><p>The report shows what is complete.</p>'
                 '<ul class="problems">')
        page.add(*(f"<li><code>{esc(p['path'])}</code> ({esc(p['kind'])}): {esc(p['message'])}</li>"
                   for p in data.problems))
        page.add("</ul>")
    page.add("<h2>Run</h2>")
    labels = {
        "steps": "steps logged", "first_step": "first step", "last_step": "last step",
        "rounds_closed": "rounds closed by a gate", "skill_rounds": "skill rounds",
        "train_groups": "training groups", "train_episodes": "training episodes",
        "validation_episodes": "validation episodes", "eval_episodes": "test episodes",
        "conditions": "test conditions", "problems": "problems found",
    }
    page.table(["", "value"], ([esc(label), page.num("int", "run", key)] for key, label in labels.items()), "facts")
    final = data.figures["training"]["final"]
    if final:
        page.add("<h2>Training dynamics</h2>")
        _plot(page, plots, "training", "Headline metrics per step (faint: raw; bold: EMA 0.9); dashed: gates")
    if data.figures["groups"]:
        page.add("<details><summary>Training groups per step</summary>")
        page.table(
            ["step", "groups", "episodes", "no reward variance", "retried", "skill-free", "admitted"],
            ([page.num("int", "groups", i, "step"), page.num("int", "groups", i, "groups"),
              page.num("int", "groups", i, "episodes"), page.num("pct1", "groups", i, "zero_variance_share"),
              page.num("pct1", "groups", i, "retry_share"), page.num("pct1", "groups", i, "skill_free_share"),
              page.num("pct1", "groups", i, "admitted_share")] for i in range(len(data.figures["groups"]))),
        )
        page.add("</details>")
    if final:
        names = [n for n in data.figures["training"]["headline"] if n in final]
        names += [n for n in sorted(final) if n not in names]
        page.add('<details id="last-values"><summary>Last value of each metric</summary>')
        page.table(
            ["metric", "step", "last", "smoothed"],
            ([esc(n), page.num("int", "training", "final", n, "step"),
              page.num("g4", "training", "final", n, "raw"),
              page.num("g4", "training", "final", n, "smooth")] for n in names),
        )
        page.add("</details>")
    _gates_section(page, data, plots)


# -- the headline: what `intraskill quickstart` prints at its end (analysis/summary.py) ------------


def _headline(page: _Page, data: BundleData) -> None:
    page.add('<section id="headline">')
    _headline_conditions(page, data)
    _headline_comparisons(page, data)
    _headline_rounds(page, data)
    _headline_funnel(page, data)
    page.add("</section>")


def _outcome_heads(figures: Mapping[str, Any]) -> list[str]:
    heads = {"reward": reward_label(figures["run"].get("reward")), **OUTCOME_HEADS}
    return [heads[o] for o in OUTCOMES]


def _outcome_fmt(name: str) -> str:
    return "pct1" if name == "success" else "f3"


def _headline_conditions(page: _Page, data: BundleData) -> None:
    table = data.figures["conditions"]
    page.add("<h2>Test conditions</h2>")
    if not table:
        page.add(_NO_EVALUATION)
        return
    reward = data.figures["run"].get("reward")
    if reward:
        page.add(f"<p>Means over the test tasks; {esc(reward_label(reward))} is the reward the run trained on.</p>")
    page.table(
        ["condition", "policy", "skill", "tasks", *_outcome_heads(data.figures)],
        ([esc(r["condition"]), esc(r["policy"]), esc(r["skill"]), page.num("int", "conditions", i, "n"),
          *(page.num(_outcome_fmt(o), "conditions", i, o) for o in OUTCOMES)] for i, r in enumerate(table)),
        "conditions headline",
    )


def _headline_comparisons(page: _Page, data: BundleData) -> None:
    comps = data.figures["comparisons"]
    if not comps:
        return
    page.add('<h2>Paired differences</h2><p>a - b on the same tasks, with paired bootstrap (BCa) 95% '
             'intervals; McNemar tests and the unchanged tasks are on the <a href="results.html">results '
             "page</a>.</p>")
    page.table(
        ["a vs b", "tasks", "newly succeed", "regress",
         *(f"{h} diff [95% CI]" for h in _outcome_heads(data.figures))],
        ([f"{esc(c['a'])} vs {esc(c['b'])}", page.num("int", "comparisons", i, "n"),
          page.num("int", "comparisons", i, "newly_succeed"), page.num("int", "comparisons", i, "regress"),
          *(_diff(page, i, o) for o in OUTCOMES)] for i, c in enumerate(comps)),
        "comparisons headline",
    )


def _headline_rounds(page: _Page, data: BundleData) -> None:
    rounds = data.figures["rounds"]
    page.add("<h2>Skill bank by round</h2>")
    if not rounds:
        page.add('<p class="empty">No gate has closed a round yet.</p>')
        return
    page.add("<p>Gate K closes round K and writes round K+1's bank (its ledger on the "
             '<a href="skills.html">skill evolution page</a>).</p>')
    page.table(
        ["gate", "step", "tasks", "new bank", *BANK_ACTIONS.values(), "active", "evidence"],
        ([page.num("int", "rounds", i, "round"), page.num("int", "rounds", i, "step"),
          page.num("int", "rounds", i, "n"), esc(r["skill"] or "not written"),
          *(page.num("int", "rounds", i, f"n_{a}") for a in BANK_ACTIONS),
          page.num("int", "rounds", i, "active"), esc(describe_evidence(r))] for i, r in enumerate(rounds)),
        "rounds",
    )


def _headline_funnel(page: _Page, data: BundleData) -> None:
    f = data.figures["training_funnel"]
    page.add("<h2>Training funnel</h2>")
    if not f["steps"]:
        page.add('<p class="empty">No training step was logged.</p>')
        return
    page.table(
        ["steps", "episodes generated", "admitted to the update", "admitted share",
         "steps that updated the policy", "steps that logged an update"],
        [[page.num("int", "training_funnel", "steps"), page.num("int", "training_funnel", "episodes_generated"),
          page.num("int", "training_funnel", "episodes_admitted"),
          page.num("pct1", "training_funnel", "admitted_share"),
          page.num("int", "training_funnel", "steps_updated"),
          page.num("int", "training_funnel", "steps_with_update")]],
        "funnel",
    )


def _gates_section(page: _Page, data: BundleData, plots: set[str]) -> None:
    gates = data.figures["gates"]
    page.add("<h2>Validation gates</h2>")
    if not gates:
        page.add('<p class="empty">No gate has closed a round yet.</p>')
        return
    page.table(
        ["round", "step", "tasks", "bare reward", "random-mask reward", "full reward",
         "gain (random - bare) [95% CI]", "McNemar p", "additivity: observed - predicted"],
        ([page.num("int", "gates", i, "round"), page.num("int", "gates", i, "step"),
          page.num("int", "gates", i, "n"), _maybe(page, "f3", "gates", i, "bare_reward"),
          _maybe(page, "f3", "gates", i, "random_reward"), _maybe(page, "f3", "gates", i, "full_reward"),
          f'{_maybe(page, "+f3", "gates", i, "gain_reward")} '
          f'[{_maybe(page, "+f3", "gates", i, "gain_reward_ci_low")}, '
          f'{_maybe(page, "+f3", "gates", i, "gain_reward_ci_high")}]',
          _maybe(page, "g4", "gates", i, "mcnemar_p"),
          _maybe(page, "+f3", "gates", i, "additivity_difference")] for i in range(len(gates))),
    )
    page.add("<h3>Failure funnel</h3>")
    page.table(
        ["round", *(s.replace("_", " ") for s in FUNNEL_STAGES)],
        ([page.num("int", "funnel", i, "round"),
          *(page.num("int", "funnel", i, s) for s in FUNNEL_STAGES)] for i in range(len(data.figures["funnel"]))),
    )
    _plot(page, plots, "funnel", "Failure funnel per round")


def _maybe(page: _Page, fmt: str, *path: str | int) -> str:
    """A number that older or partial gate documents may lack: a dash when absent."""
    try:
        return page.num(fmt, *path)
    except (KeyError, IndexError):
        return "–"


def _results(page: _Page, data: BundleData, plots: set[str]) -> None:
    table = data.figures["conditions"]
    page.add("<h2>Test conditions</h2>")
    if not table:
        page.add(_NO_EVALUATION)
        return
    page.table(
        ["condition", "policy", "skill", "tasks", *_outcome_heads(data.figures), "successes"],
        ([esc(r["condition"]), esc(r["policy"]), esc(r["skill"]), page.num("int", "conditions", i, "n"),
          *(page.num(_outcome_fmt(o), "conditions", i, o) for o in OUTCOMES),
          page.num("int", "conditions", i, "successes")] for i, r in enumerate(table)),
        "conditions",
    )
    _plot(page, plots, "conditions", "The run's reward, strict reward and success per condition")
    comps = data.figures["comparisons"]
    if comps:
        page.add("<h2>Paired comparisons (same tasks)</h2><p>Differences are a - b; intervals are "
                 "paired bootstrap (BCa) 95% intervals over tasks; McNemar is exact.</p>")
        page.table(
            ["a vs b", "tasks", "newly succeed", "regress", "both succeed", "both fail",
             *(f"{h} diff [95% CI]" for h in _outcome_heads(data.figures)), "McNemar p"],
            ([f"{esc(c['a'])} vs {esc(c['b'])}", page.num("int", "comparisons", i, "n"),
              page.num("int", "comparisons", i, "newly_succeed"), page.num("int", "comparisons", i, "regress"),
              page.num("int", "comparisons", i, "both_succeed"), page.num("int", "comparisons", i, "both_fail"),
              *(_diff(page, i, o) for o in OUTCOMES),
              page.num("g4", "comparisons", i, "mcnemar_p")] for i, c in enumerate(comps)),
            "comparisons",
        )
        _plot(page, plots, "flips", "Outcome flips per comparison")


def _diff(page: _Page, i: int, name: str) -> str:
    return (f'{page.num("+f3", "comparisons", i, f"{name}_diff")} '
            f'[{page.num("+f3", "comparisons", i, f"{name}_ci_low")}, '
            f'{page.num("+f3", "comparisons", i, f"{name}_ci_high")}]')


def _behaviour(page: _Page, data: BundleData, plots: set[str]) -> None:
    rows = []
    for source, key, label in (("test", "by_condition", ("condition",)), ("validation", "by_checkpoint", ("round", "arm"))):
        for i, r in enumerate(data.figures["behaviour"][key]):
            group = " / ".join(f"{k} {r[k]}" if k == "round" else str(r[k]) for k in label)
            rows.append({"source": source, "group": group, "outcome": r["outcome"],
                         "pointer": pointer("behaviour", key, i),
                         "values": {f: r[f] for f in ("n", *BEHAVIOUR_FIELDS)}})
    page.add(
        "<h2>Behaviour explorer</h2><p>Means per episode. Test episodes by condition; validation "
        "episodes (the same fixed tasks at every gate's checkpoint) by round and arm. Product visits "
        "count arrivals on a product page, not option changes on it.</p>"
        '<form id="filters" class="filters">'
        '<label>source <select id="f-source"><option value="all">all</option>'
        '<option value="test">test conditions</option><option value="validation">validation checkpoints</option>'
        '</select></label> <label>outcome <select id="f-outcome"><option value="all">all episodes</option>'
        '<option value="success">successes</option><option value="failure">failures</option>'
        '<option value="split">successes and failures</option></select></label> '
        '<label>group contains <input id="f-group" type="search" placeholder="e.g. trained, round 1, random"></label>'
        "</form>"
        '<table id="explorer"><thead><tr><th>source</th><th>group</th><th>outcome</th><th>episodes</th>'
        + "".join(f"<th>{esc(FIELD_LABELS[f])}</th>" for f in BEHAVIOUR_FIELDS)
        + '</tr></thead><tbody></tbody></table><p id="explorer-empty" class="empty" hidden>No rows match.</p>'
    )
    payload = {"fields": list(BEHAVIOUR_FIELDS), "rows": rows}
    # "</" inside a script element would end it early; JSON allows the escaped form.
    page.add('<script type="application/json" id="behaviour-data">'
             + json.dumps(payload, ensure_ascii=False).replace("</", "<\\/") + "</script>")
    _plot(page, plots, "behaviour", "Behaviour per test condition: successes vs failures")
    _plot(page, plots, "behaviour_checkpoints", "Behaviour on the validation tasks across checkpoints")


def _skills(page: _Page, data: BundleData, plots: set[str]) -> None:
    page.add("<h2>Skill evolution</h2>")
    if not data.skills:
        page.add('<p class="empty">No skill round was recorded.</p>')
        return
    counts = data.figures["skills"]
    page.table(
        ["round", "skill", "active", "retired", "retained", "rewritten", "added", "retired this round"],
        ([page.num("int", "skills", i, "round"), esc(s["name"]), page.num("int", "skills", i, "active"),
          page.num("int", "skills", i, "retired"), page.num("int", "skills", i, "n_retain"),
          page.num("int", "skills", i, "n_rewrite"), page.num("int", "skills", i, "n_add"),
          page.num("int", "skills", i, "n_retire")] for i, s in enumerate(counts)),
    )
    _plot(page, plots, "contributions", "Contribution of each chunk at every gate (beta, 95% CI)")
    estimates = {(r["round"], r["column"]): i for i, r in enumerate(data.figures["contributions"])}
    page.add('<nav class="rounds">' + " ".join(
        f'<a href="#round-{s["round"]}">round {esc(s["round"])}</a>' for s in data.skills) + "</nav>")
    for s in data.skills:
        k = int(s["round"])
        page.add(f'<section class="round" id="round-{k}"><h3>Round {k}: <code>{esc(s["name"])}</code></h3>')
        if s.get("ledger"):
            page.add("<details><summary>How this round's bank came about (ledger of the gate that "
                     f"closed round {k - 1})</summary><ul>")
            page.add(*(f"<li><b>{esc(e['action'])}</b> <code>{esc(e['chunk_id'])}</code>: {esc(e['reason'])}</li>"
                       for e in s["ledger"]))
            page.add("</ul></details>")
        for c in s["chunks"]:
            j = estimates.get((k, c["id"]))
            estimate = (
                f'gate of round {k}: beta {page.num("+f3", "contributions", j, "beta")} '
                f'[{page.num("+f3", "contributions", j, "ci_low")}, {page.num("+f3", "contributions", j, "ci_high")}], '
                f'{esc(data.figures["contributions"][j]["action"] or "")}'
                if j is not None else "not tested by a gate in this round"
            )
            page.add(
                f'<article class="chunk {esc(c["status"])}" data-round="{k}" data-chunk="{esc(c["id"])}">'
                f'<h4><code>{esc(c["id"])}</code> {esc(c["title"])} <small>{esc(c["status"])}, '
                f'revision {esc(c["revision"])}; {estimate}</small></h4>'
                f'<div class="texts"><div class="text" lang="en" data-lang="en">{esc(c["en"])}</div>'
                f'<div class="text" lang="zh" data-lang="zh">{esc(c["zh"])}</div></div></article>'
            )
        page.add("</section>")
