"""behaviour.py: means split by outcome, per condition and per gate round and arm, against NumPy."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from intraskill_jax import rundir
from intraskill_jax.analysis import behaviour


def _assert_means(summary: list[dict], rows: list[dict], keys: tuple[str, ...]) -> None:
    for s in summary:
        sel = [r for r in rows if all(r[k] == s[k] for k in keys)]
        if s["outcome"] != "all":
            sel = [r for r in sel if r["success"] == (s["outcome"] == "success")]
        assert s["n"] == len(sel)
        for f in behaviour.BEHAVIOUR_FIELDS:
            if sel:
                assert s[f] == pytest.approx(np.mean([r[f] for r in sel]), abs=1e-12), (s, f)
            else:
                assert s[f] is None


def test_by_condition_matches_numpy(run_dir: Path) -> None:
    rows = rundir.read_jsonl(rundir.eval_outcomes_path(run_dir))
    summary = behaviour.behaviour_by_condition(rows)
    conditions = sorted({r["condition"] for r in rows})
    assert [(s["condition"], s["outcome"]) for s in summary] == [
        (c, o) for c in conditions for o in behaviour.OUTCOMES]
    assert len(conditions) == 4 and {s["n"] for s in summary if s["outcome"] == "all"} == {20}
    _assert_means(summary, rows, ("condition",))
    # The run's episodes differ in behaviour, so the split by outcome is not a copy of the whole.
    assert any(s["turns"] != t["turns"] for s, t in zip(summary[1::3], summary[2::3]) if s["n"] and t["n"])


def test_across_checkpoints_groups_round_and_arm(tiny, run_dir: Path) -> None:
    rounds = range(tiny.config.train.rounds)
    rows = [r for k in rounds for r in rundir.read_jsonl(rundir.gate_episodes_path(run_dir, k))]
    summary = behaviour.behaviour_across_checkpoints(rows)
    keys = [(s["round"], s["arm"]) for s in summary if s["outcome"] == "all"]
    assert keys == [(k, arm) for k in rounds for arm in ("bare", "full", "random")]
    by = {(s["round"], s["arm"], s["outcome"]): s for s in summary}
    n = tiny.config.skills.validation_tasks
    for k in rounds:
        for arm in ("bare", "full", "random"):
            assert by[(k, arm, "all")]["n"] == n == by[(k, arm, "success")]["n"] + by[(k, arm, "failure")]["n"]
    _assert_means(summary, rows, ("round", "arm"))


def test_outcome_with_no_episodes_gives_none() -> None:
    rows = [{"condition": "c", "success": True, "turns": 3, "tokens_per_turn": 10.0,
             "searches": 1, "product_visits": 1, "repairs": 0}]
    by = {s["outcome"]: s for s in behaviour.behaviour_by_condition(rows)}
    assert by["failure"]["n"] == 0 and by["failure"]["turns"] is None
    assert by["success"]["turns"] == by["all"]["turns"] == 3.0
