"""results.py against hand NumPy computations on the tiny run's test outcomes."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import norm

from intraskill_jax import rundir
from intraskill_jax.analysis import results
from intraskill_jax.skills.bank import SkillBank


@pytest.fixture(scope="module")
def rows(run_dir: Path) -> list[dict]:
    return rundir.read_jsonl(rundir.eval_outcomes_path(run_dir))


def _arrays(rows: list[dict], cond: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Task ids, success, the run's reward (`reward`) and the strict reward, in task order."""
    sel = sorted((r for r in rows if r["condition"] == cond), key=lambda r: r["task_id"])
    return (
        np.array([r["task_id"] for r in sel]),
        np.array([r["success"] for r in sel], bool),
        np.array([r["reward"] for r in sel]),
        np.array([r["reward_detail"]["strict"] for r in sel]),
    )


def test_condition_table_matches_numpy(tiny, run_dir: Path, rows: list[dict]) -> None:
    table = results.condition_table(rows)
    assert [r["condition"] for r in table] == list(results.DEFAULT_CONDITIONS)
    for r in table:
        _, ok, reward, strict = _arrays(rows, r["condition"])
        assert r["n"] == ok.size == tiny.config.eval.num_tasks
        assert r["success"] == pytest.approx(ok.mean(), abs=1e-15)
        assert r["successes"] == int(ok.sum())
        assert r["reward"] == pytest.approx(reward.mean(), abs=1e-15)
        assert r["strict"] == pytest.approx(strict.mean(), abs=1e-15)
    # The run trains on the loose reward, which gives partial credit where strict gives none: a
    # table that read one for the other would be caught.
    assert tiny.config.sim.env.reward == "loose" and any(r["reward"] > r["strict"] + 0.05 for r in table)
    final = SkillBank.load_round(run_dir, tiny.config.train.rounds)
    skills = {r["condition"]: r["skill"] for r in table}
    assert skills == {"base_bare": "none", "base_skill": "s0-brief", "trained_bare": "none", "trained_skill": final.name}
    assert [r["policy"] for r in table] == ["base", "base", "trained", "trained"]


def test_reward_is_the_runs_own_and_strict_its_component() -> None:
    # Hand-made: loose partial credit where strict gives nothing, and a record without a breakdown.
    rows = [
        {"condition": "c", "task_id": 1, "reward": 0.5, "success": False,
         "reward_detail": {"strict": 0.0, "loose": 0.5}},
        {"condition": "c", "task_id": 2, "reward": 1.0, "success": True,
         "reward_detail": {"strict": 1.0, "loose": 1.0}},
        {"condition": "c", "task_id": 3, "reward": 0.25, "success": False},
    ]
    (r,) = results.condition_table(rows)
    assert r["reward"] == pytest.approx((0.5 + 1.0 + 0.25) / 3)
    assert r["strict"] == pytest.approx((0.0 + 1.0 + 0.25) / 3)
    assert r["success"] == pytest.approx(1 / 3) and r["successes"] == 1
    assert results.reward_name({"sim": {"env": {"reward": "loose"}}}) == "loose"
    assert results.reward_name({}) is None and results.reward_label(None) == "reward"


def _exact_mcnemar_p(n10: int, n01: int) -> float:
    # Two-sided exact binomial test of n10 among the discordant pairs at p = 1/2.
    m, k = n10 + n01, min(n10, n01)
    if m == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(m, i) for i in range(k + 1)) / 2**m)


def _bca(d: np.ndarray, resamples: int = 40000, level: float = 0.95) -> tuple[float, float]:
    """Bias-corrected and accelerated bootstrap interval of mean(d), written out in NumPy."""
    rng = np.random.default_rng(1)
    theta = d.mean()
    boot = d[rng.integers(0, d.size, (resamples, d.size))].mean(axis=1)
    z0 = norm.ppf((boot < theta).mean() + 0.5 * (boot == theta).mean())
    jack = (d.sum() - d) / (d.size - 1)
    dev = jack.mean() - jack
    acc = (dev**3).sum() / (6 * (dev**2).sum() ** 1.5)
    z = norm.ppf([(1 - level) / 2, (1 + level) / 2])
    quantiles = norm.cdf(z0 + (z0 + z) / (1 - acc * (z0 + z)))
    low, high = np.quantile(boot, quantiles)
    return float(low), float(high)


def test_paired_comparisons_match_numpy(rows: list[dict]) -> None:
    comps = results.paired_comparisons(rows)
    # the rows hold the four conditions only: the pairs with a zero-shot condition are left out
    assert [(c["a"], c["b"]) for c in comps] == [p for p in results.DEFAULT_PAIRS if "pretrained_bare" not in p]
    for c in comps:
        ta, ok_a, rew_a, strict_a = _arrays(rows, c["a"])
        tb, ok_b, rew_b, strict_b = _arrays(rows, c["b"])
        assert np.array_equal(ta, tb)
        assert c["n"] == ta.size and c["unpaired"] == 0
        assert c["newly_succeed"] == int(np.sum(ok_a & ~ok_b))
        assert c["regress"] == int(np.sum(~ok_a & ok_b))
        assert c["both_succeed"] == int(np.sum(ok_a & ok_b))
        assert c["both_fail"] == int(np.sum(~ok_a & ~ok_b))
        assert c["newly_succeed"] + c["regress"] + c["both_succeed"] + c["both_fail"] == c["n"]
        assert c["mcnemar_p"] == pytest.approx(_exact_mcnemar_p(c["newly_succeed"], c["regress"]))
        assert c["reward_a"] == pytest.approx(rew_a.mean()) and c["strict_b"] == pytest.approx(strict_b.mean())
        for name, x, y in (("success", ok_a.astype(float), ok_b.astype(float)), ("reward", rew_a, rew_b),
                           ("strict", strict_a, strict_b)):
            d = x - y
            assert c[f"{name}_diff"] == pytest.approx(d.mean(), abs=1e-12)
            low, high = _bca(d)
            # Different resampling streams: the bounds agree to about one step of the
            # discrete bootstrap distribution (1/n for success).
            assert c[f"{name}_ci_low"] == pytest.approx(low, abs=1.2 / d.size)
            assert c[f"{name}_ci_high"] == pytest.approx(high, abs=1.2 / d.size)
            assert c[f"{name}_ci_low"] <= c[f"{name}_diff"] <= c[f"{name}_ci_high"]
    # Some pair's reward and strict differences differ: the columns are not one read twice.
    assert any(c["reward_diff"] != pytest.approx(c["strict_diff"], abs=1e-3) for c in comps)
    # And some pair differs at all, with flips both ways somewhere: the outcomes carry information.
    assert any(c["success_ci_low"] > 0 for c in comps) and any(c["newly_succeed"] and c["regress"] for c in comps)


def test_unpaired_tasks_are_left_out_and_counted(rows: list[dict]) -> None:
    a = [r for r in rows if r["condition"] == "trained_skill" and r["task_id"] % 5 != 0]
    b = [r for r in rows if r["condition"] == "base_skill" and r["task_id"] % 7 != 0]
    (c,) = results.paired_comparisons(a + b, [("trained_skill", "base_skill")])
    common = {r["task_id"] for r in a} & {r["task_id"] for r in b}
    assert c["n"] == len(common)
    assert c["unpaired"] == len({r["task_id"] for r in a} ^ {r["task_id"] for r in b})
    ok = {(r["condition"], r["task_id"]): r["success"] for r in a + b}
    assert c["newly_succeed"] == sum(ok[("trained_skill", t)] and not ok[("base_skill", t)] for t in common)


def test_subset_of_conditions_and_errors(rows: list[dict]) -> None:
    bare_only = [r for r in rows if r["condition"].endswith("_bare")]
    assert [(c["a"], c["b"]) for c in results.paired_comparisons(bare_only)] == [("trained_bare", "base_bare")]
    with pytest.raises(ValueError, match="no outcomes for condition 'base_skill'"):
        results.paired_comparisons(bare_only, [("trained_bare", "base_skill")])
    with pytest.raises(ValueError, match="two episodes of task"):
        results.condition_table(bare_only + bare_only[:1])
    assert results.condition_table([]) == [] and results.paired_comparisons([]) == []


def test_identical_conditions_give_degenerate_intervals(rows: list[dict]) -> None:
    same = [r for r in rows if r["condition"] == "base_bare"]
    twin = [{**r, "condition": "base_again"} for r in same]
    (c,) = results.paired_comparisons(same + twin, [("base_again", "base_bare")])
    assert c["newly_succeed"] == c["regress"] == 0 and c["mcnemar_p"] == 1.0
    assert c["success_diff"] == c["success_ci_low"] == c["success_ci_high"] == 0.0


def test_paired_outcomes_and_text_tables(tiny, rows: list[dict]) -> None:
    wide = results.paired_outcomes(rows)
    assert len(wide) == tiny.config.eval.num_tasks
    first = {r["condition"]: r for r in rows if r["task_id"] == wide[0]["task_id"]}
    for cond, r in first.items():
        assert wide[0][f"success/{cond}"] == r["success"]
        assert wide[0][f"reward/{cond}"] == r["reward"]
        assert wide[0][f"strict/{cond}"] == r["reward_detail"]["strict"]
    text = results.format_condition_table(results.condition_table(rows), "loose")
    lines = text.splitlines()
    assert "trained_skill" in text and len(lines) == 5 and "reward (loose)" in lines[0]
    # Aligned: every row's strict column ends where its header does.
    end = lines[0].index("strict") + len("strict")
    assert all(line[end - 1] != " " and line[end] == " " for line in lines)
    comp_text = results.format_comparisons(results.paired_comparisons(rows))
    assert "trained_skill vs base_skill" in comp_text and "d strict [95% CI]" in comp_text
