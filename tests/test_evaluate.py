"""Evaluation conditions: parsing, and the ranking appendix's chunk subsets."""

from pathlib import Path

import pytest

from intraskill_jax.evaluate import DEFAULT, Condition, parse_condition, ranking_conditions
from intraskill_jax.skills.bank import LedgerEntry, SkillBank

S0 = Path(__file__).resolve().parents[1] / "skills" / "s0"


def test_conditions_parse_by_name_or_policy_skill_pair():
    assert parse_condition("base_skill") == DEFAULT["base_skill"]
    assert parse_condition("mine=/ckpt/x:none") == Condition("mine", "/ckpt/x", "none")
    for bad in ("nope", "x=trained", "=base:none", "x=:none"):
        with pytest.raises(ValueError):
            parse_condition(bad)


def test_ranking_subsets_follow_the_latest_contributions():
    s0 = SkillBank.load(S0)
    ids = s0.active_ids
    betas = {ids[0]: 0.3, ids[1]: -0.2, ids[2]: 0.1, ids[3]: 0.5}  # the rest were never estimated
    ledger = [LedgerEntry(c, "retain", "test", {"beta": b, "se": 0.1}) for c, b in betas.items()]
    bank = s0.next_version(s0.chunks, ledger)
    top, bottom, random, bare, full = ranking_conditions(bank, 2, seed=0)
    on = lambda c: {i for i, m in zip(ids, c.mask) if m}  # noqa: E731
    assert on(top) == {ids[3], ids[0]}
    assert on(bottom) == set(ids[-2:])  # unestimated chunks rank below every estimate
    assert len(on(random)) == 2 and random.mask == ranking_conditions(bank, 2, seed=0)[2].mask
    assert (bare, full) == (DEFAULT["trained_bare"], DEFAULT["trained_skill"])
    assert {c.policy for c in (top, bottom, random)} == {"trained"}
    with pytest.raises(ValueError, match="k must be"):
        ranking_conditions(bank, len(ids) + 1)


def test_pretrained_conditions_play_the_checkpoint_before_the_warm_start(monkeypatch, tmp_path):
    from intraskill_jax import evaluate as evaluate_lib
    from intraskill_jax import rundir
    from intraskill_jax.errors import ConfigError
    from intraskill_jax.runconfig import EvalConfig, RunConfig

    monkeypatch.setattr(evaluate_lib, "prepare_policy", lambda config, workdir, world: "the checkpoint")
    monkeypatch.setattr(rundir, "is_published", lambda path: True)  # the warm start has finished
    config = RunConfig()
    assert evaluate_lib.policy_path(config, tmp_path, "base", None) == rundir.sft_policy_dir(tmp_path)
    assert evaluate_lib.policy_path(config, tmp_path, "pretrained", None) == "the checkpoint"
    assert parse_condition("pretrained_bare") == Condition("pretrained_bare", "pretrained", "none")
    assert parse_condition("pretrained_skill") == Condition("pretrained_skill", "pretrained", "initial")
    EvalConfig(conditions=("base_bare", "pretrained_bare", "pretrained_skill"))
    with pytest.raises(ConfigError, match="unknown \\['zero_shot'\\].*pretrained_skill"):
        EvalConfig(conditions=("zero_shot",))
