"""Tests for intraskill_jax/skills/masks.py: group context sampling and full-skill retries."""

import warnings
from pathlib import Path

import numpy as np
import pytest

from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.rl.rollouts import all_wrong_groups, record_retry, retry_metrics
from intraskill_jax.skills.bank import LedgerEntry, SkillBank
from intraskill_jax.skills.masks import (
    MaskConfig,
    inclusion_probabilities,
    retry_context,
    sample_contexts,
)

S0 = Path(__file__).resolve().parents[2] / "skills" / "s0"


@pytest.fixture(scope="module")
def s0() -> SkillBank:
    return SkillBank.load(S0)


def _with_estimates(bank: SkillBank, betas_ses: dict[str, tuple[float, float]]) -> SkillBank:
    entries = [
        LedgerEntry(
            cid,
            "retain",
            "test",
            {"beta": b, "se": s, "ci_low": 0.0, "ci_high": 0.0, "p": 1.0, "n": 200},
        )
        for cid, (b, s) in betas_ses.items()
    ]
    return bank.next_version(bank.chunks, entries)


def test_skill_free_fraction_and_uniform_inclusion_before_the_first_gate(s0):
    rng = np.random.default_rng(0)
    ctx = [c for _ in range(500) for c in sample_contexts(s0, 16, rng, "en")]
    masks = np.asarray([c.skill_mask for c in ctx])
    free = ~masks.any(axis=1)
    # 20% skill-free by construction, plus the 0.5**10 chance that a skill group draws nothing
    assert abs(free.mean() - (0.2 + 0.8 * 0.5**10)) < 0.01
    on = masks[masks.any(axis=1)].mean(axis=0)
    np.testing.assert_allclose(on, 0.5 / (1 - 0.5**10), atol=0.02)  # conditional on not all-off
    for c in ctx[:50]:
        assert isinstance(c, SkillContext)
        assert c.skill_text == s0.render(c.skill_mask, "en")
        assert (c.skill_text == "") == (sum(c.skill_mask) == 0)


def test_skill_free_count_is_within_one_group_of_the_fraction(s0):
    rng = np.random.default_rng(1)
    for n in (1, 5, 8, 16):
        for _ in range(20):
            cfg = MaskConfig(
                skill_free=0.3, floor=1.0, ceiling=1.0, prior=1.0
            )  # every skill group gets all chunks
            free = sum(sum(c.skill_mask) == 0 for c in sample_contexts(s0, n, rng, "zh", cfg))
            assert abs(free - 0.3 * n) < 1


def test_inclusion_follows_estimates_with_floor_and_ceiling(s0):
    ids = s0.active_ids
    bank = _with_estimates(
        s0, {ids[0]: (0.2, 0.05), ids[1]: (-0.2, 0.05), ids[2]: (0.05, 0.05), ids[3]: (0.0, 0.1)}
    )
    cfg = MaskConfig(skill_free=0.0, floor=0.1, ceiling=0.85)
    p = inclusion_probabilities(bank, cfg)
    np.testing.assert_allclose(p[:4], [0.85, 0.1, 1 / (1 + np.exp(-1.0)), 0.5])
    np.testing.assert_allclose(p[4:], 0.5)  # no estimate: the prior
    rng = np.random.default_rng(2)
    masks = np.asarray(
        [c.skill_mask for _ in range(400) for c in sample_contexts(bank, 10, rng, "en", cfg)]
    )
    np.testing.assert_allclose(masks.mean(axis=0), p, atol=0.025)
    hot = MaskConfig(skill_free=0.0, temperature=4.0, floor=0.0, ceiling=1.0)
    assert inclusion_probabilities(bank, hot)[0] == pytest.approx(1 / (1 + np.exp(-1.0)))
    # An exact estimate (se 0) goes to the floor or ceiling by its sign; an exact zero is neutral.
    exact = _with_estimates(s0, {ids[0]: (0.1, 0.0), ids[1]: (-0.1, 0.0), ids[2]: (0.0, 0.0)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0 * inf on the way
        np.testing.assert_allclose(inclusion_probabilities(exact, cfg)[:3], [0.85, 0.1, 0.5])


def test_sampling_is_seeded(s0):
    a = sample_contexts(s0, 32, np.random.default_rng(7), "en")
    b = sample_contexts(s0, 32, np.random.default_rng(7), "en")
    assert a == b


def test_config_validation():
    with pytest.raises(ValueError, match="floor <= ceiling"):
        MaskConfig(floor=0.9, ceiling=0.1)
    with pytest.raises(ValueError, match="skill_free"):
        MaskConfig(skill_free=1.5)


def test_retry_context_and_records(s0):
    ctx = retry_context(s0, "zh")
    assert ctx.skill_mask == (1,) * 10 and ctx.skill_text == s0.render(s0.full_mask(), "zh")
    successes = [0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0]
    np.testing.assert_array_equal(all_wrong_groups(successes, 4), [0, 2])
    with pytest.raises(ValueError):
        all_wrong_groups(successes, 5)
    outcomes = [
        record_retry(0, 11, (0,) * 10, [0.0, 1.0, 0.5, 0.0], [False, True, False, False]),
        record_retry(2, 13, (1,) * 10, [0.0] * 4, [False] * 4),
    ]
    assert outcomes[0].recovered and not outcomes[1].recovered
    m = retry_metrics(outcomes)
    assert m["skills/retry_groups"] == 2 and m["skills/retry_recovered_groups"] == 1
    assert m["skills/retry_success_rate"] == pytest.approx(1 / 8)
    assert retry_metrics([])["skills/retry_recovery_rate"] == 0.0
