"""Tests for intraskill_jax/skills/gate.py: the decision rule, the arms, and the power simulation."""

import json
from pathlib import Path

import numpy as np
import pytest

from intraskill_jax import stats
from intraskill_jax.skills.bank import Proposal, SkillBank
from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.skills.gate import GateConfig, Outcome, decide, draw_masks, run_gate
from intraskill_jax.skills.power import PowerConfig, bernoulli_evaluate, simulate, synthetic_bank

S0 = Path(__file__).resolve().parents[2] / "skills" / "s0"


def outcomes(rewards):
    """Test episodes that succeed exactly when their reward is 1 (a strict reward)."""
    return [Outcome(float(r), bool(r >= 1.0)) for r in rewards]


def _fit(beta, se):
    """Contributions with given betas and SEs (normal 95% intervals, two-sided p)."""
    beta, se = np.asarray(beta, float), np.asarray(se, float)
    from scipy import stats as sps

    z = sps.norm.ppf(0.975)
    return stats.Contributions(
        beta,
        se,
        beta - z * se,
        beta + z * se,
        2 * sps.norm.sf(np.abs(beta / se)),
        200,
        np.diag(se**2),
        "HC3",
        0.05,
    )


@pytest.fixture(scope="module")
def bank() -> SkillBank:
    return synthetic_bank(4)


def _rewrite(target, pid, text="Better."):
    return Proposal(
        pid, "rewrite", text, "更好。", target=target, trajectory_ids=("ep-1",), source="offline"
    )


def test_positive_rule_retains_and_retires(bank):
    nxt, decisions = decide(bank, [], _fit([0.05, -0.01, 0.0, 0.2], [0.1] * 4))
    assert nxt.round == 1 and nxt.name == "s1"
    assert [d.action for d in decisions] == ["retain", "retire", "retire", "retain"]
    assert nxt.active_ids == ("chunk-0", "chunk-3")
    assert nxt.chunk("chunk-1").status == "retired"
    assert [e.action for e in nxt.ledger] == ["retain", "retire", "retire", "retain"]
    assert nxt.ledger[0].estimate["beta"] == pytest.approx(0.05)


def test_significant_and_unless_harmful_rules(bank):
    fit = _fit([0.25, 0.1, -0.1, -0.25], [0.1] * 4)  # z = 2.5, 1, -1, -2.5
    sig, _ = decide(bank, [], fit, GateConfig(rule="significant"))
    assert sig.active_ids == ("chunk-0",)
    lenient, _ = decide(bank, [], fit, GateConfig(rule="unless_harmful"))
    assert lenient.active_ids == ("chunk-0", "chunk-1", "chunk-2")
    margin, _ = decide(bank, [], fit, GateConfig(rule="positive", min_effect=0.15))
    assert margin.active_ids == ("chunk-0",)


def test_bh_replaces_raw_intervals(bank):
    # raw p of chunk-1 is 0.03 (significant alone), but not after BH over 4 columns at q=0.05
    fit = _fit([0.4, 0.217, 0.0, 0.0], [0.1] * 4)
    raw, _ = decide(bank, [], fit, GateConfig(rule="significant"))
    assert raw.active_ids == ("chunk-0", "chunk-1")
    bh, decisions = decide(bank, [], fit, GateConfig(rule="significant", bh=True, q=0.05))
    assert bh.active_ids == ("chunk-0",)
    assert "p_adjusted" in decisions[1].estimate and decisions[1].estimate["p_adjusted"] > 0.05


def test_rewrite_only_if_it_beats_its_target(bank):
    props = [
        _rewrite("chunk-0", "r1-a", "Rewrite A."),
        _rewrite("chunk-0", "r1-b", "Rewrite B."),
        _rewrite("chunk-1", "r1-c", "Rewrite C."),
    ]
    # chunk-0 0.1; rewrites of it 0.15 and 0.2 (B wins); chunk-1 0.1 vs its rewrite 0.05 (kept)
    fit = _fit([0.1, 0.1, -0.1, -0.1, 0.15, 0.2, 0.05], [0.05] * 7)
    nxt, decisions = decide(bank, props, fit)
    c0 = nxt.chunk("chunk-0")
    assert (c0.en, c0.revision, c0.status) == ("Rewrite B.", 1, "active")
    assert nxt.chunk("chunk-1").en == bank.chunk("chunk-1").en
    by = {d.column: d.action for d in decisions}
    assert by == {
        "chunk-0": "rewrite",
        "chunk-1": "retain",
        "chunk-2": "retire",
        "chunk-3": "retire",
        "r1-a": "superseded",
        "r1-b": "rewrite",
        "r1-c": "superseded",
    }
    entry = next(e for e in nxt.ledger if e.chunk_id == "chunk-0")
    assert (
        entry.action == "rewrite"
        and entry.proposal_id == "r1-b"
        and entry.trajectory_ids == ("ep-1",)
    )
    assert (
        entry.previous_text["en"] == bank.chunk("chunk-0").en
        and entry.estimate["replaced"]["beta"] == 0.1
    )
    assert {r["id"] for r in nxt.ledger_extra["rejected_proposals"]} == {"r1-a", "r1-c"}
    # a margin makes B not good enough either
    nxt, _ = decide(bank, props, fit, GateConfig(rewrite_margin=0.15))
    assert nxt.chunk("chunk-0").revision == 0


def test_additions_and_cap(bank):
    props = [
        Proposal("r1-new", "add", "New step.", "新步骤。", title="New", trajectory_ids=("ep-2",)),
        Proposal("r1-bad", "add", "Bad step.", "坏步骤。"),
    ]
    nxt, _ = decide(bank, props, _fit([0.3, 0.2, 0.1, -0.1, 0.25, -0.2], [0.05] * 6))
    assert nxt.active_ids == ("chunk-0", "chunk-1", "chunk-2", "r1-new")
    assert next(e for e in nxt.ledger if e.chunk_id == "r1-new").action == "add"
    capped, _ = decide(
        bank, props, _fit([0.3, 0.2, 0.1, -0.1, 0.25, -0.2], [0.05] * 6), GateConfig(max_active=2)
    )
    assert capped.active_ids == ("chunk-0", "r1-new")
    assert "max_active" in next(e for e in capped.ledger if e.chunk_id == "chunk-1").reason


def test_run_gate_arms_contexts_and_round_files(tmp_path):
    s0 = SkillBank.load(S0)
    props = [
        Proposal("r1-search-early", "add", "Search early.", "尽早搜索。", title="Search early")
    ]
    calls = []
    k = len(s0.active) + 1
    betas = np.zeros(k)
    betas[0], betas[-1] = 0.3, 0.3

    def evaluate(task_ids, contexts):
        calls.append((list(task_ids), list(contexts)))
        masks = np.asarray([c.skill_mask for c in contexts], float)
        base = (np.asarray(task_ids) % 2) * 0.5
        return outcomes(base + masks @ betas)  # deterministic, exactly additive

    tasks = list(range(100, 160))
    res = run_gate(
        evaluate,
        s0,
        props,
        tasks,
        np.random.default_rng(0),
        config=GateConfig(bootstrap_resamples=200, min_effect=1e-6),
    )  # exact zeros come out at ~1e-17
    ((ids, ctx),) = calls
    assert ids == tasks * 3 and len(ctx) == 180
    assert all(c.skill_text == "" and c.skill_mask == (0,) * k for c in ctx[:60])
    assert all(c.skill_mask == (1,) * k for c in ctx[120:])
    assert "Search early." in ctx[120].skill_text
    np.testing.assert_array_equal(res.masks, [c.skill_mask for c in ctx[60:120]])
    np.testing.assert_allclose(res.contributions.beta, betas, atol=1e-9)
    assert res.additivity.difference == pytest.approx(0.0, abs=1e-9)
    assert res.columns == s0.active_ids + ("r1-search-early",)
    assert res.bank.active_ids == ("query-specific", "r1-search-early")
    assert res.metrics["gate/add"] == 1 and res.metrics["gate/chunks_after"] == 2
    round_dir = res.bank.save_round(tmp_path)
    doc = json.loads((round_dir / "ledger.json").read_text())
    assert doc["fit"]["columns"][-1] == "r1-search-early" and doc["validation_task_ids"] == tasks
    assert SkillBank.load_round(tmp_path, 1) == res.bank


def test_run_gate_rejects_bad_inputs(bank):
    with pytest.raises(ValueError, match="cannot identify"):
        run_gate(lambda t, c: outcomes([0.0] * len(t)), bank, [], [1, 2, 3], np.random.default_rng(0))
    with pytest.raises(ValueError, match="returned"):
        run_gate(lambda t, c: outcomes([0.0]), bank, [], list(range(20)), np.random.default_rng(0))
    with pytest.raises(ValueError, match="proposal ids"):
        run_gate(
            lambda t, c: outcomes([0.0] * len(t)),
            bank,
            [Proposal("chunk-0", "add", "x", "是")],
            list(range(20)),
            np.random.default_rng(0),
        )
    assert (
        np.linalg.matrix_rank(draw_masks(30, 5, 0.5, np.random.default_rng(0)).astype(float)) == 5
    )


def test_power_simulation_matches_the_predicted_rates():
    """Known betas, paired Bernoulli outcomes, 10 chunks, n=200: the gate keeps helpful chunks and
    drops harmful ones at the rates Phi(beta/SE) predicts (python -m intraskill_jax.skills.power)."""
    reps = 200
    report = simulate(PowerConfig(replicates=reps, seed=3))
    assert 0.25 < report["discordance"] < 0.35
    assert report["measured_se_mean"] == pytest.approx(report["predicted_se"], rel=0.1)
    for rule, r in report["rules"].items():
        for cls in ("power", "false_retain", "null_retain"):
            pred, meas = r[cls]["predicted"], r[cls]["measured"]
            # pooled over 2-4 chunks x reps; MC sd <= 0.5/sqrt(2*reps) ~ 0.032, plus ~0.03 for the
            # asymptotic SE (HC3 runs ~5% wider at n=200)
            assert abs(meas - pred) < 0.03 + 3 * 0.5 / np.sqrt(2 * reps), (rule, cls, pred, meas)
    positive = report["rules"]["positive"]
    assert positive["power"]["measured"] > 0.75 and positive["false_retain"]["measured"] < 0.2
    assert report["rules"]["significant"]["false_retain"]["measured"] < 0.02


def test_bernoulli_evaluate_is_paired_through_the_task_draw():
    rng = np.random.default_rng(0)
    ev = bernoulli_evaluate(np.array([0.0]), np.full(4000, 0.5), rng.random(4000), 1.0, rng)
    ctx = [SkillContext("", (0,))] * 4000
    a, b = np.asarray(ev(range(4000), ctx)), np.asarray(ev(range(4000), ctx))
    np.testing.assert_array_equal(a, b)  # full coupling, no effect: identical reruns


def test_drawn_masks_are_full_rank_with_every_leverage_below_one():
    for seed in range(30):  # 13 columns over 16 tasks: degenerate draws are common here
        x = draw_masks(16, 13, 0.5, np.random.default_rng(seed)).astype(float)
        assert np.linalg.matrix_rank(x) == 13
        hat = x @ np.linalg.inv(x.T @ x) @ x.T
        assert np.diag(hat).max() < 1 - 1e-9


@pytest.mark.parametrize("outcome", ["all_zero", "all_equal", "too_few_discordant"])
def test_no_decision_without_evidence(bank, outcome, caplog):
    """Outcomes that cannot tell the columns apart keep the bank: every chunk as it was (ledger:
    retain, with the reason), no proposal judged, and the log says so."""
    props = [Proposal("r1-new", "add", "New step.", "新步骤。")]
    k = len(bank.active) + len(props)
    tasks = list(range(40))
    wins = set(tasks[:k])  # k discordant tasks: one fewer than the k + 1 the fit needs

    def evaluate(task_ids, contexts):
        n = len(tasks)
        if outcome == "all_zero":
            return outcomes([0.0] * len(task_ids))
        if outcome == "all_equal":  # every random-arm episode beats its bare twin by the same 0.5
            return outcomes([0.0] * n + [0.5] * (len(task_ids) - n))
        random = [1.0 if t in wins else 0.0 for t in task_ids[n:2 * n]]
        return outcomes([0.0] * n + random + [0.0] * (len(task_ids) - 2 * n))

    with caplog.at_level("WARNING", logger="intraskill_jax.skills.gate"):
        res = run_gate(evaluate, bank, props, tasks, np.random.default_rng(0),
                       config=GateConfig(bootstrap_resamples=0))
    assert res.bank.active_ids == bank.active_ids and res.bank.round == bank.round + 1
    assert [c.en for c in res.bank.active] == [c.en for c in bank.active]
    assert [e.action for e in res.bank.ledger] == ["retain"] * len(bank.active)
    assert all("no evidence" in e.reason for e in res.bank.ledger)
    assert {d.column: d.action for d in res.decisions}["r1-new"] == "reject"
    assert res.metrics["gate/evidence"] == 0.0 and res.metrics["gate/retire"] == 0
    assert res.bank.ledger_extra["evidence"]["informative"] is False
    assert "no evidence" in caplog.text and "kept unchanged" in caplog.text


def test_enough_discordant_pairs_let_the_gate_decide(bank):
    """One more discordant task (k + 1) and the rule judges: chunk-0 is on in every winning pair
    and off in every losing one, so it is kept and the ledger cites the fit, not a lack of it."""
    tasks = list(range(40))
    k = len(bank.active)
    moved = set(tasks[:k + 1])

    def evaluate(task_ids, contexts):
        n = len(tasks)
        rand = [(1.0 if c.skill_mask[0] else -1.0) if t in moved else 0.0
                for t, c in zip(task_ids[n:2 * n], contexts[n:2 * n])]
        return outcomes([0.0] * n + rand + [0.0] * (len(task_ids) - 2 * n))

    res = run_gate(evaluate, bank, [], tasks, np.random.default_rng(0), config=GateConfig(bootstrap_resamples=0))
    assert res.metrics["gate/discordant"] == k + 1 and res.metrics["gate/evidence"] == 1.0
    assert res.contributions.beta[0] > 0 and "chunk-0" in res.bank.active_ids
    assert not any("no evidence" in e.reason for e in res.bank.ledger)


def test_gate_success_is_the_episodes_own_not_a_reward_threshold(bank):
    """Under a loose reward an episode can score 1.0 and fail, or succeed below 1.0: the gate's
    success rates and McNemar count what each episode says, like every other success rate."""
    tasks = list(range(30))
    n = len(tasks)

    def evaluate(task_ids, contexts):
        # bare: reward 1.0 but never a success; random: reward 0.5, a success on even tasks
        return ([Outcome(1.0, False)] * n + [Outcome(0.5, t % 2 == 0) for t in task_ids[n:2 * n]]
                + [Outcome(0.5, True)] * (len(task_ids) - 2 * n))

    res = run_gate(evaluate, bank, [], tasks, np.random.default_rng(0), config=GateConfig(bootstrap_resamples=0))
    assert res.metrics["gate/bare_reward"] == 1.0 and res.metrics["gate/bare_success"] == 0.0
    assert res.metrics["gate/random_success"] == 0.5 and res.metrics["gate/full_success"] == 1.0
    assert res.metrics["gate/discordance"] == 0.5
    from scipy.stats import binomtest

    assert res.metrics["gate/mcnemar_p"] == pytest.approx(binomtest(0, 15, 0.5).pvalue)  # 15 flips, all one way
