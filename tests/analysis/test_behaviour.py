"""behaviour.py: means split by outcome, per condition and per gate round and arm."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from intraskill_jax import rundir
from intraskill_jax.analysis import behaviour


def test_by_condition_matches_numpy(run_dir: Path) -> None:
    rows = rundir.read_jsonl(rundir.eval_outcomes_path(run_dir))
    summary = behaviour.behaviour_by_condition(rows)
    assert len(summary) == 4 * 3
    for s in summary:
        sel = [r for r in rows if r["condition"] == s["condition"]]
        if s["outcome"] != "all":
            sel = [r for r in sel if r["success"] == (s["outcome"] == "success")]
        assert s["n"] == len(sel)
        for f in behaviour.BEHAVIOUR_FIELDS:
            assert s[f] == pytest.approx(np.mean([r[f] for r in sel]), abs=1e-12)


def test_across_checkpoints_groups_round_and_arm(run_dir: Path) -> None:
    rows = [
        {**r, "round": k}
        for k in (0, 1)
        for r in rundir.read_jsonl(rundir.gate_episodes_path(run_dir, k))
    ]
    summary = behaviour.behaviour_across_checkpoints(rows)
    keys = [(s["round"], s["arm"]) for s in summary if s["outcome"] == "all"]
    assert keys == [(0, "bare"), (0, "full"), (0, "random"), (1, "bare"), (1, "full"), (1, "random")]
    by = {(s["round"], s["arm"], s["outcome"]): s for s in summary}
    assert by[(1, "full", "all")]["n"] == 48
    assert by[(1, "full", "success")]["n"] + by[(1, "full", "failure")]["n"] == 48


def test_outcome_with_no_episodes_gives_none() -> None:
    rows = [{"condition": "c", "success": True, "turns": 3, "tokens_per_turn": 10.0,
             "searches": 1, "product_visits": 1, "repairs": 0}]
    by = {s["outcome"]: s for s in behaviour.behaviour_by_condition(rows)}
    assert by["failure"]["n"] == 0 and by["failure"]["turns"] is None
    assert by["success"]["turns"] == by["all"]["turns"] == 3.0
