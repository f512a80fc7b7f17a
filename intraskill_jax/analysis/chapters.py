"""Chapters 1-3 and 7: background and method; task, environment and reward (with one complete
shopping trace); protocol; reproduce. Words from the catalogue (`ch<N>.*`), numbers from
figures.json, records (the trace, versions, the config) as the bundle holds them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from intraskill_jax.analysis.bundle import MANIFEST
from intraskill_jax.analysis.overview import REWARD_PARTS
from intraskill_jax.analysis.site import Page, chapter_head, code, esc

# The trace chapter 2 shows whole: the trained policy without the skill (the headline's condition)
# succeeding, else the nearest example the run recorded.
TRACE_PREFERENCE = (("trained_bare", True), ("trained_skill", True), ("trained_bare", False),
                    ("base_bare", True), ("base_skill", True))


def main_trace(traces: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the trace chapter 2 shows, None when the bundle has none."""
    for condition, success in TRACE_PREFERENCE:
        for k, t in enumerate(traces):
            if t["condition"] == condition and bool(t["success"]) == success:
                return k
    return 0 if traces else None


# -- 01 background and method --------------------------------------------------------------------


def method(page: Page) -> None:
    chapter_head(page, 1)
    page.section("why", "ch1.why_title")
    page.add(page.paras("ch1.why"))
    page.section("chunk", "ch1.chunk_title")
    page.add(page.paras("ch1.chunk"))
    if page.data.skills:
        first = page.data.skills[0]
        name = code(first.get("name"))
        page.add("<p>" + page.t("ch1.initial_bank", name=name, n=page.maybe("int", "run", "initial_chunks"),
                                link=page.a("results", "skills", "nav.results")) + "</p>")
        page.table([page.t("col.chunk"), page.t("col.title")],
                   ([f"<code>{esc(c['id'])}</code>", esc(c["title"])] for c in first["chunks"]), "chunks")
    page.section("loop", "ch1.loop_title")
    page.add('<ol class="steps">')
    for title, text in zip(page.items("ch1.loop_titles"), page.items("ch1.loop_texts")):
        page.add(f"<li><strong>{title}</strong><span>{text}</span></li>")
    page.add("</ol>")
    p = ("protocol",)
    page.add(page.paras(
        "ch1.settings",
        skill_free=page.maybe("pct1", *p, "masks", "skill_free"), prior=page.maybe("f2", *p, "masks", "prior"),
        floor=page.maybe("f2", *p, "masks", "floor"), ceiling=page.maybe("f2", *p, "masks", "ceiling"),
        size=page.maybe("int", *p, "schedule", "group_size"), groups=page.maybe("int", *p, "schedule", "groups_per_step"),
        every=page.maybe("int", *p, "schedule", "gate_every"), rounds=page.maybe("int", *p, "schedule", "rounds"),
        tasks=page.maybe("int", *p, "schedule", "validation_tasks")))
    page.section("gate", "ch1.gate_title")
    page.add('<p class="equation">R<sub>i</sub> − B<sub>i</sub> = C<sub>i</sub><sup>⊤</sup>β + ε<sub>i</sub></p>')
    page.add(page.paras("ch1.gate"))
    page.section("meaning", "ch1.meaning_title")
    page.add(page.paras("ch1.meaning"))


# -- 02 task, environment and reward --------------------------------------------------------------


def task(page: Page) -> None:
    chapter_head(page, 2)
    traces = page.data.traces
    k = main_trace(traces)
    page.section("anatomy", "ch2.anatomy_title")
    page.add(page.paras("ch2.anatomy"))
    env = (page.data.config.get("sim") or {}).get("env") or {}
    if k is not None and traces[k].get("task"):
        _task_goal(page, traces[k]["task"], persona=bool(env.get("persona")))
    page.section("profile", "ch2.profile_title")
    page.add(page.paras("ch2.profile"),
             f"<p>{page.t('ch2.profile_on' if env.get('persona') else 'ch2.profile_off')}</p>")
    page.section("environment", "ch2.env_title")
    e = ("protocol", "env")
    page.add(page.paras("ch2.env", mode=code(env.get("mode", "single")),
                        page_size=page.maybe("int", *e, "page_size"), top_n=page.maybe("int", *e, "results_top_n"),
                        max_steps=page.maybe("int", *e, "max_steps"),
                        max_turns=page.maybe("int", "protocol", "agent", "max_turns")))
    page.table([page.t("col.tool"), page.t("col.what")],
               ([f"<code>{name}</code>", text] for name, text in zip(page.items("ch2.tool_names"), page.items("ch2.tool_texts"))),
               "tools")
    page.section("reward", "ch2.reward_title")
    page.add(page.paras("ch2.reward"))
    page.table([page.t("col.part"), page.t("col.what")],
               ([code(name), page.t(f"reward.{name}")] for name in REWARD_PARTS), "reward-parts")
    reward = env.get("reward")
    if reward:
        page.add("<p>" + page.t("ch2.reward_run", name=code(reward)) + "</p>")
    page.section("trace", "ch2.trace_title")
    if k is None:
        page.empty("ch2.no_trace")
        return
    page.add(f"<p>{page.t('ch2.trace_lead', link=page.link('behaviour', 'cases'))}</p>")
    render_trace(page, k, open_=True)


def _task_goal(page: Page, goal: Mapping[str, Any], *, persona: bool) -> None:
    options = goal.get("options") or {}
    rows = [
        (page.t("task.instruction"), f"<q>{esc(goal.get('instruction', ''))}</q>"),
        (page.t("task.attributes"), ", ".join(f"<code>{esc(a)}</code>" for a in goal.get("attributes") or ()) or "–"),
        (page.t("task.options"), ", ".join(f"<code>{esc(k)}: {esc(v)}</code>" for k, v in options.items()) or "–"),
        (page.t("task.price"), esc(f"{goal['price_upper']:.2f}") if goal.get("price_upper") is not None else "–"),
        (page.t("task.category"), esc(" › ".join(goal.get("category") or ())) or "–"),
    ]
    if persona and goal.get("hidden_aspect"):  # only persona mode keeps it out of the instruction
        rows.append((page.t("task.hidden"), page.t("task.hidden_value", aspect=code(goal["hidden_aspect"]),
                                                    value=code(goal.get("hidden_value")))))
    page.add(f"<p>{page.t('task.lead', task=esc(goal.get('task_id')))}</p><dl class=\"facts\">",
             *(f"<dt>{a}</dt><dd>{b}</dd>" for a, b in rows), "</dl>")


def render_trace(page: Page, k: int, *, open_: bool) -> None:
    """Trace `k` of the bundle whole, in a <details id="trace-k"> (`open_`: shown unfolded): the
    prompt, then each turn's reply (text, token count, pieces), its action and the observation that
    followed, and the reward at the end."""
    t = page.data.traces[k]
    f = ("traces", k)
    outcome = page.t("outcome.success" if t["success"] else "outcome.failure")
    title = page.t("trace.title", condition=code(t["condition"]), task=page.num("int", *f, "task_id"))
    summary = page.t("trace.summary", turns=str(len(t["transcript"])), tokens=page.maybe("int", *f, "generated_tokens"),
                     reward=page.num("f3", *f, "reward"))
    page.add(f'<details class="trace" id="trace-{k}"{" open" if open_ else ""}><summary class="trace-head">'
             f'<strong>{title}</strong> <span class="tag {"ok" if t["success"] else "bad"}">{outcome}</span> {summary}</summary>')
    page.add(f'<details class="prompt"{" open" if open_ else ""}><summary>{page.t("trace.prompt", tokens=page.maybe("int", *f, "prompt_tokens"))}</summary>'
             f'<pre>{esc(t.get("prompt", ""))}</pre></details><ol class="turns">')
    last = len(t["transcript"]) - 1
    for j, turn in enumerate(t["transcript"]):
        u = (*f, "turns", j)
        action = code(turn["action"]) if turn.get("action") else "–"
        repair = f' <span class="tag bad">{page.t("trace.repair", why=esc(turn["repair"]))}</span>' if turn.get("repair") else ""
        pieces = "".join(f"<span>{esc(p)}</span>" for p in turn.get("reply_tokens") or ())
        page.add(
            f'<li class="turn"><p class="turn-head">{page.t("trace.turn", n=str(j + 1))} · '
            f'{page.t("trace.reply", tokens=page.num("int", *u, "reply_tokens"))} · {page.t("trace.action")} {action}{repair}</p>'
            f'<pre class="reply">{esc(turn.get("reply", ""))}</pre>'
            f'<details class="tokens"><summary>{page.t("trace.pieces")}</summary><div class="pieces">{pieces}</div></details>'
        )
        if turn.get("observation"):
            page.add(f'<p class="obs-head">{page.t("trace.observation", tokens=page.num("int", *u, "observation_tokens"))}</p>'
                     f'<pre class="obs">{esc(turn["observation"])}</pre>')
        elif j == last:
            page.add(f'<p class="obs-head">{page.t("trace.end_truncated" if t.get("truncated") else "trace.end")}</p>')
        reward = (page.t("trace.reward_pending") if j < last
                  else page.t("trace.reward_final", reward=page.num("f3", *f, "reward")))
        page.add(f'<p class="turn-reward">{reward}</p></li>')
    page.add("</ol>")
    page.add(f'<p class="obs-head">{page.t("trace.reward_title")}</p>')
    page.table([esc(p) for p in REWARD_PARTS],
               [[page.maybe("f3", *f, "reward_detail", p) for p in REWARD_PARTS]], "reward-detail")
    page.add("</details>")


# -- 03 protocol ----------------------------------------------------------------------------------


def protocol(page: Page) -> None:
    chapter_head(page, 3)
    p = ("protocol",)
    page.section("splits", "ch3.splits_title")
    page.add(page.paras("ch3.splits"))
    if page.value(*p, "splits") is not None:
        s = (*p, "schedule")
        page.table(
            [page.t("col.split"), page.t("col.tasks"), page.t("col.used")],
            [[page.t("split.train"), page.num("int", *p, "splits", "train"),
              page.t("split.train_used", groups=page.maybe("int", *s, "groups_per_step"), size=page.maybe("int", *s, "group_size"))],
             [page.t("split.validation"), page.num("int", *p, "splits", "validation"),
              page.t("split.validation_used", tasks=page.maybe("int", *s, "validation_tasks"))],
             [page.t("split.test"), page.num("int", *p, "splits", "test"),
              page.t("split.test_used", tasks=page.maybe("int", *s, "test_tasks"))]],
            "splits")
        page.add(f"<p>{page.t('ch3.catalog', products=page.maybe('int', *p, 'catalog', 'products'), tasks=page.maybe('int', *p, 'catalog', 'tasks'))}</p>")
    else:
        page.empty("ch3.no_provenance")
    _model(page)
    page.section("decoding", "ch3.decoding_title")
    page.add(page.paras("ch3.decoding"))
    keys = ("temperature", "top_p", "top_k", "max_new_tokens")
    page.table([page.t("col.setting"), page.t("col.rollout"), page.t("col.eval")],
               ([f"<code>{k}</code>", page.maybe("g4", *p, "decoding", "rollout", k), page.maybe("g4", *p, "decoding", "eval", k)]
                for k in keys), "decoding")
    a = (*p, "agent")
    page.add(f"<p>{page.t('ch3.agent', turns=page.maybe('int', *a, 'max_turns'), context=page.maybe('int', *a, 'max_context_tokens'), chars=page.maybe('int', *a, 'max_observation_chars'))}</p>")
    page.section("denominators", "ch3.denominators_title")
    loss = ((page.data.config.get("train") or {}).get("loss") or {})
    s = (*p, "schedule")
    page.add(page.paras(
        "ch3.denominators", groups=page.maybe("int", *s, "groups_per_step"), size=page.maybe("int", *s, "group_size"),
        per_step=page.maybe("int", *s, "episodes_per_step"), generated=page.maybe("int", "training_funnel", "episodes_generated"),
        admitted=page.maybe("int", "training_funnel", "episodes_admitted"), share=page.maybe("pct1", "training_funnel", "admitted_share"),
        aggregation=code(loss.get("aggregation", "–"))))
    page.table([page.t("col.setting"), page.t("col.value")],
               ([f"<code>{esc(group)}.{esc(k)}</code>", page.maybe("g4", *p, group, k)]
                for group in ("optim", "loss") for k in (page.value(*p, group) or {})), "settings")
    page.section("schedule", "ch3.schedule_title")
    page.add(page.paras("ch3.schedule", rounds=page.maybe("int", *s, "rounds"), every=page.maybe("int", *s, "gate_every"),
                        steps=page.maybe("int", *s, "steps"), tasks=page.maybe("int", *s, "validation_tasks")))
    _config(page)
    _software(page)
    _stages(page)


def _model(page: Page) -> None:
    page.section("model", "ch3.model_title")
    model = page.data.provenance.get("model") or {}
    config = model.get("config") or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    warm = (page.data.config.get("warm_start") or {}).get("enabled")
    start = page.t("ch3.model_start_path", path=code(model["policy_path"])) if model.get("policy_path") else page.t("ch3.model_start_fresh")
    page.add(f"<p>{start} {page.t('ch3.warm_on' if warm else 'ch3.warm_off')}</p>")
    if not model:
        page.empty("ch3.no_model")
        return
    rows = [(page.t("model.which"), page.t(f"model.{'trained' if model.get('which') == 'trained policy' else 'starting'}")),
            (page.t("model.type"), esc(config.get("model_type", "–"))),
            (page.t("model.architecture"), esc(", ".join(config.get("architectures") or ["–"]))),
            (page.t("model.parameters"), page.num("si", "run", "parameters"))]
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings"):
        if key in text:
            rows.append((f"<code>{key}</code>", esc(text[key])))
    if text.get("layer_types"):
        kinds: dict[str, int] = {}
        for kind in text["layer_types"]:
            kinds[kind] = kinds.get(kind, 0) + 1
        rows.append(("<code>layer_types</code>", esc(", ".join(f"{n} × {k}" for k, n in kinds.items()))))
    rows.append((page.t("model.dtypes"), esc(", ".join(f"{k}: {n:,}" for k, n in (model.get("dtypes") or {}).items()))))
    page.table([page.t("col.setting"), page.t("col.value")], rows, "model")


def _config(page: Page) -> None:
    page.section("config", "ch3.config_title")
    digest = page.sha256("config.json")
    text = page.t("ch3.config", name=code(page.data.config.get("name", "–")), sha=code(digest, "hash"),
                  link=page.a("reproduce", "files", "nav.reproduce"))
    page.add(f"<p>{text}</p><details><summary>{page.t('ch3.config_show')}</summary>"
             f"<pre>{esc(json.dumps(page.data.config, indent=1, ensure_ascii=False))}</pre></details>")


def _software(page: Page) -> None:
    page.section("software", "ch3.software_title")
    sessions = page.data.provenance.get("sessions") or []
    if not sessions:
        page.empty("ch3.no_provenance")
        return
    page.add(page.paras("ch3.software"))
    heads = [page.t("col.package"), *(f"{esc(s['command'])} · {esc(s['started'])}" for s in sessions)]
    names = list(dict.fromkeys(n for s in sessions for n in s.get("packages") or {}))
    rows = [["Python", *(esc(s.get("python")) for s in sessions)]]
    rows += [[f"<code>{esc(n)}</code>", *(esc((s.get("packages") or {}).get(n) or "–") for s in sessions)] for n in names]
    git = [s.get("git") or {} for s in sessions]
    rows.append([page.t("software.commit"), *(
        f"<code class=\"hash\">{esc(g.get('commit') or '–')}</code>" + (f" {page.t('software.dirty')}" if g.get("dirty") else "")
        for g in git)])
    page.table(heads, rows, "versions")
    page.section("machine", "ch3.machine_title")
    rows = [[page.t("machine.platform"), *(esc(s.get("platform")) for s in sessions)],
            [page.t("machine.cpus"), *(esc((s.get("machine") or {}).get("cpus")) for s in sessions)],
            [page.t("machine.memory"), *(esc((s.get("machine") or {}).get("memory_gib")) for s in sessions)],
            [page.t("machine.devices"), *(_devices(s.get("devices") or {}) for s in sessions)]]
    page.table([page.t("col.setting"), *heads[1:]], rows, "machine")


def _devices(d: Mapping[str, Any]) -> str:
    if not d:
        return "–"
    return esc(f"{d.get('count')} × {d.get('kind')} ({d.get('backend')}, {d.get('processes')} process(es))")


def _stages(page: Page) -> None:
    page.section("stages", "ch3.stages_title")
    totals = page.value("protocol", "stage_totals") or []
    if not totals:
        page.empty("ch3.no_stages")
        return
    page.add(page.paras("ch3.stages"))
    page.table([page.t("col.stage"), page.t("col.times"), page.t("col.wall")],
               ([page.t(f"stage.{r['stage']}") if f"stage.{r['stage']}" in page.text else esc(r["stage"]),
                 page.num("int", "protocol", "stage_totals", i, "count"),
                 page.num("dur", "protocol", "stage_totals", i, "seconds")] for i, r in enumerate(totals)), "stages")
    rows = []
    for i, r in enumerate(page.value("protocol", "stages") or []):
        detail = ", ".join(f"{k} {esc(v)}" for k, v in r.items() if k not in ("kind", "stage", "seconds", "ended"))
        label = page.t(f"stage.{r['stage']}") if f"stage.{r['stage']}" in page.text else esc(r["stage"])
        rows.append([label, esc(detail), page.num("dur", "protocol", "stages", i, "seconds"), esc(r.get("ended", ""))])
    page.add(f"<details><summary>{page.t('ch3.stages_each')}</summary>")
    page.table([page.t("col.stage"), page.t("col.detail"), page.t("col.wall"), page.t("col.ended")], rows, "stages")
    page.add("</details>")


# -- 07 reproduce ---------------------------------------------------------------------------------


def reproduce(page: Page) -> None:
    chapter_head(page, 7)
    page.section("commands", "ch7.commands_title")
    page.add(page.paras("ch7.commands"))
    page.add("<pre class=\"commands\">" + esc("\n".join(page.text["ch7.command_lines"])) + "</pre>")
    page.add(page.paras("ch7.offline"))
    page.section("files", "ch7.files_title")
    page.add(page.paras("ch7.files", manifest=code(page.manifest_sha or "–", "hash")))
    files = page.manifest.get("files") or {}
    page.table([page.t("col.file"), page.t("col.what"), page.t("col.bytes"), "SHA-256"],
               ([code(rel), _file_role(page, rel), esc(f"{entry.get('bytes', 0):,}"), code(entry.get("sha256"), "hash")]
                for rel, entry in sorted(files.items())),
               "files")
    page.section("check", "ch7.check_title")
    page.add(page.paras("ch7.check", manifest=code(MANIFEST)))


def _file_role(page: Page, rel: str) -> str:
    key = "file." + ("skills" if rel.startswith("skills/") else rel.split(".")[0])
    return page.t(key) if key in page.text else ""
