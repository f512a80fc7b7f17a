"""The terminal summary: its numbers against the run's records, and against the report's figures."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from intraskill_jax import rundir
from intraskill_jax.analysis import training
from intraskill_jax.analysis.bundle import figures_of_run
from intraskill_jax.analysis.rundata import load_run
from intraskill_jax.analysis.summary import format_summary


def _section(text: str, title: str) -> list[list[str]]:
    """The rows of the table under the paragraph starting with `title`, split into cells."""
    block = next(b for b in text.split("\n\n") if b.startswith(title))
    lines = block.splitlines()[1:]
    return [re.split(r"\s{2,}", line.strip()) for line in lines]


def _by_condition(run_dir: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rundir.read_jsonl(rundir.eval_outcomes_path(run_dir)):
        out.setdefault(r["condition"], []).append(r)
    return {c: sorted(rows, key=lambda r: r["task_id"]) for c, rows in out.items()}


# The report's bootstrap, as its tables state it (95%) and its figures.json's settings record it.
CONFIDENCE, RESAMPLES, SEED = 0.95, 9999, 0


def _interval(a: np.ndarray, b: np.ndarray) -> str:
    """The paired bootstrap (BCa) interval of mean(a - b), computed here with scipy alone, as the
    summary prints it."""
    d = a - b
    if np.all(d == d[0]):
        low = high = d[0]
    else:
        ci = scipy.stats.bootstrap((a, b), lambda x, y, axis=-1: np.mean(x - y, axis=axis), paired=True,
                                   vectorized=True, confidence_level=CONFIDENCE, n_resamples=RESAMPLES,
                                   method="BCa", rng=np.random.default_rng(SEED)).confidence_interval
        low, high = ci.low, ci.high
    cells = ["n/a" if not np.isfinite(x) else f"{x:+.3f}" for x in (d.mean(), low, high)]
    return f"{cells[0]} [{cells[1]}, {cells[2]}]"


def _mcnemar_p(newly: int, regress: int) -> float:
    """The exact McNemar test: a two-sided binomial test of one direction's share of the flips."""
    return 1.0 if newly + regress == 0 else scipy.stats.binomtest(newly, newly + regress, 0.5).pvalue


def test_summary_numbers_follow_from_the_records(tiny, report, run_dir: Path) -> None:
    """Every figure of the summary's header and test tables recomputed here from the run's own
    records (config.json, metrics.jsonl, gates/, eval/outcomes.jsonl) with numpy and scipy, never
    through the analysis package's figures.

    Sabotage checked (each on a copy of the package): success counted as any reward > 0 in
    `results.condition_table` fails the success column; newly-succeed and regress swapped in
    `results._compare` fails the flip counts; the report's intervals at 90% instead of 95%
    (`bundle.SETTINGS`) and McNemar's chi-square in place of the exact test fail the interval and
    p-value cells; each of these passes `test_summary_figures_are_the_reports`."""
    text = format_summary(run_dir)
    assert "\x1b[" not in text  # plain text: no colour codes
    eps = _by_condition(run_dir)

    metrics = rundir.read_jsonl(run_dir / "metrics.jsonl")
    gates = sorted(p.name for p in (run_dir / "gates").iterdir() if re.fullmatch(r"round_\d+\.json", p.name))
    reward = json.loads((run_dir / "config.json").read_text())["sim"]["env"]["reward"]
    assert text.splitlines()[0] == (f"IntraSkill run {run_dir}: {len({r['step'] for r in metrics})} training steps "
                                    f"logged, {len(gates)} round(s) closed by a gate; trained on the {reward} reward")

    head, *rows = _section(text, "Test conditions")
    assert head == ["condition", "policy", "skill", "tasks", f"reward ({reward})", "strict", "success"]
    assert [r[0] for r in rows] == ["base_bare", "base_skill", "trained_bare", "trained_skill"]
    for cond, policy, skill, n, reward_cell, strict, success in rows:
        e = eps[cond]
        assert int(n) == len(e) == tiny.config.eval.num_tasks and policy == e[0]["policy"] and skill == e[0]["skill"]
        assert reward_cell == f"{np.mean([r['reward'] for r in e]):.3f}"
        assert strict == f"{np.mean([r['reward_detail']['strict'] for r in e]):.3f}"
        successes = sum(bool(r["success"]) for r in e)
        assert success == f"{successes / len(e):.1%}", cond
    assert any(r[4] != r[5] for r in rows)  # the run's loose reward differs from strict: columns not swapped
    assert len({r[6] for r in rows}) > 1  # the conditions' success counts differ: the check can fail

    head, *rows = _section(text, "Paired differences")
    assert head == ["a vs b", "tasks", "+", "-", "d reward [95% CI]", "d strict [95% CI]", "d success [95% CI]",
                    "McNemar p"]
    pairs = [tuple(r[0].split(" vs ")) for r in rows]
    assert pairs == [("trained_skill", "base_skill"), ("trained_bare", "base_bare"), ("base_skill", "base_bare"),
                     ("trained_skill", "trained_bare"), ("trained_skill", "base_bare")]
    for (a, b), row in zip(pairs, rows):
        by_task = {r["task_id"]: r for r in eps[b]}
        both = [(x, by_task[x["task_id"]]) for x in eps[a] if x["task_id"] in by_task]
        assert int(row[1]) == len(both) == len(eps[a])
        ok_a, ok_b = (np.array([bool(p[i]["success"]) for p in both]) for i in (0, 1))
        newly, regress = int(np.sum(ok_a & ~ok_b)), int(np.sum(~ok_a & ok_b))
        assert (int(row[2]), int(row[3])) == (newly, regress), (a, b)
        for cell, outcome in zip(row[4:7], (lambda r: r["reward"], lambda r: r["reward_detail"]["strict"],
                                            lambda r: float(r["success"]))):
            x, y = (np.array([outcome(p[i]) for p in both], np.float64) for i in (0, 1))
            assert cell == _interval(x, y), (a, b)
        assert row[7] == f"{_mcnemar_p(newly, regress):.4f}", (a, b)
    assert any(int(r[2]) != int(r[3]) for r in rows)  # flips are one-sided somewhere: a swap would show

    head, *rows = _section(text, "Skill bank")
    assert head == ["gate", "step", "tasks", "new bank", "retained", "rewritten", "added", "retired",
                    "active", "evidence"]
    assert len(rows) == tiny.config.train.rounds
    for row in rows:
        k = int(row[0])
        ledger = json.loads((run_dir / "skills" / f"round_{k + 1}" / "ledger.json").read_text())
        actions = Counter(e["action"] for e in ledger["entries"])
        gate = json.loads(rundir.gate_path(run_dir, k).read_text())
        assert int(row[1]) == gate["step"] and int(row[2]) == gate["n"] and row[3] == ledger["skill"]
        assert [int(x) for x in row[4:8]] == [actions[a] for a in ("retain", "rewrite", "add", "retire")]
        assert row[9] == f"yes: {ledger['evidence']['reason']}"

    metrics = rundir.read_jsonl(run_dir / "metrics.jsonl")
    generated = sum(r.get("rollout/episodes_generated", 0) for r in metrics)
    admitted = sum(r.get("rollout/episodes_admitted", 0) for r in metrics)
    updated = sum(r.get("train/updated", 0) > 0 for r in metrics)
    steps = tiny.config.train.steps
    assert 0 < admitted < generated and 0 < updated < steps  # the funnel's numbers are not trivial
    assert (f"Training: {steps} steps; {generated:.0f} episodes generated, {admitted:.0f} admitted to the "
            f"update ({admitted / generated:.1%}); {updated} of {steps} steps updated the policy") in text
    assert f"Report:      {run_dir / 'report' / 'index.html'}\n" in text
    assert text.endswith(f"TensorBoard: tensorboard --logdir {run_dir / 'tb'}")


def test_summary_figures_are_the_reports(report, run_dir: Path, figures: dict) -> None:
    assert json.loads(json.dumps(figures_of_run(load_run(run_dir)))) == figures


def test_summary_of_a_run_without_evaluation_or_gate(partial_run_dir: Path, fresh_run_dir: Path) -> None:
    text = format_summary(partial_run_dir)
    assert "Test conditions: no evaluation yet (eval/outcomes.jsonl is absent)" in text
    assert "Paired differences" not in text
    assert "1 incomplete or damaged record(s)" in text
    assert "Report:      not built yet: `intraskill report" in text

    text = format_summary(fresh_run_dir)
    assert "Skill bank: no gate has closed a round yet" in text.splitlines()
    steps = len({r["step"] for r in rundir.read_jsonl(fresh_run_dir / "metrics.jsonl")})
    assert f"Training: {steps} steps;" in text


def test_bank_rounds_without_evidence_and_from_old_runs() -> None:
    gates = [{"round": 0, "step": 5, "n": 48, "summary": {"evidence": 0.0}},
             {"round": 1, "step": 10, "n": 48, "summary": {}},
             {"round": 2, "step": 15, "n": 48, "summary": {"evidence": 1.0}}]
    why = "no evidence: all 48 paired deltas equal +0.000"
    skills = [
        {"round": 1, "name": "s1", "chunks": [{"status": "active"}] * 3,
         "ledger": [{"action": "retain"}] * 3, "evidence": {"informative": False, "reason": why}},
        {"round": 2, "name": "s2", "chunks": [{"status": "active"}, {"status": "retired"}],
         "ledger": [{"action": "retain"}, {"action": "retire"}, {"action": "rewrite"}], "evidence": None},
    ]
    kept, old, unwritten = training.bank_rounds(gates, skills)
    assert (kept["n_retain"], kept["n_retire"], kept["active"], kept["informative"]) == (3, 0, 3, False)
    assert training.describe_evidence(kept) == f"{why}; bank kept unchanged"
    assert (old["n_retire"], old["n_rewrite"], old["active"], old["informative"]) == (1, 1, 1, None)
    assert training.describe_evidence(old).startswith("not recorded")
    assert unwritten["skill"] is None and unwritten["n_retain"] is None and unwritten["informative"] is True


def test_training_funnel_counts() -> None:
    rows = [{"step": 1, "rollout/episodes_generated": 64.0, "rollout/episodes_admitted": 16.0, "train/updated": 1.0},
            {"step": 2, "rollout/episodes_generated": 64.0, "rollout/episodes_admitted": 0.0, "train/updated": 0.0},
            {"step": 3}]
    f = training.training_funnel(rows)
    assert f == {"steps": 3, "episodes_generated": 128, "episodes_admitted": 16, "admitted_share": 0.125,
                 "steps_with_update": 2, "steps_updated": 1}
    assert training.training_funnel([{"step": 1}])["episodes_generated"] is None


def test_summary_of_no_run_names_the_path(tmp_path: Path) -> None:
    from intraskill_jax.analysis.rundata import RunDataError

    with pytest.raises(RunDataError, match="no run directory"):
        format_summary(tmp_path / "missing")
