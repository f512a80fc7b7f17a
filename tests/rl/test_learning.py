"""The RL loop learns a one-turn task: through the real Learner (tests/rl/learning.py), a tiny policy
warm-started by SFT on demonstrations right 75% of the time is taken by GRPO alone from its measured
held-out success to >= 90% and at least 0.25 above it, on `tests.toys.CueEnv` (read a colour, click
the matching side) at temperature 1.0 with one on-policy update per batch (no old log-probs: the
ratio is exactly 1). The same run with its advantages negated must not improve, so the test can
fail. The three-turn task at the configs' temperature with two updates per batch is
tests/rl/test_learning_multiturn.py.
"""

import numpy as np
import pytest

from intraskill_jax.agent.episode import AgentConfig
from intraskill_jax.rl import rollouts
from intraskill_jax.rollout.base import SamplingParams

from tests.rl.learning import Setting, click, noisy_side, shared_programs, toy_tokenizer, train, warm_policy  # noqa: F401
from tests.toys import CueEnv

SINGLE = Setting(make_env=CueEnv, sampling=SamplingParams(temperature=1.0, max_new_tokens=32), updates_per_batch=1,
                 agent=AgentConfig(tool_format="xml", max_turns=1, max_context_tokens=512, max_observation_chars=200,
                                   show_affordances=False), learning_rate=1e-3)
STEPS = 48  # at 40, an AMD EPYC with AVX2 ended at 0.89 (114 of 128 held-out tasks) where 0.90 is asked
DEMO_ACCURACY = 0.75


@pytest.fixture(scope="module")
def tokenizer():
    return toy_tokenizer()


@pytest.fixture(scope="module")
def warm(tokenizer):
    """SFT on noisy demonstrations, right only DEMO_ACCURACY of the time: a weak policy."""
    return warm_policy(tokenizer, SINGLE, lambda task, text, rng: click(noisy_side(task, rng, DEMO_ACCURACY)))


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_grpo_takes_a_weak_policy_to_the_task_and_negated_advantages_do_not(tokenizer, warm, tmp_path, monkeypatch,
                                                                           shared_programs):  # noqa: F811
    run = train(tokenizer, warm, SINGLE, tmp_path / "grpo", STEPS)
    assert run.after >= max(0.9, run.before + 0.25), f"GRPO took success from {run.before:.2f} only to {run.after:.2f}"
    assert all(r["train/ratio_mean"] == 1.0 for r in run.rows if r["train/updated"])  # one update: on-policy

    real = rollouts.group_advantages
    monkeypatch.setattr(rollouts, "group_advantages", lambda *a, **k: -real(*a, **k))
    # As many steps as GRPO's run: a mid-run reading of two steps' rollouts is too noisy to stand in
    # for it (on an AMD EPYC Zen 4 a gradient spike at step 15 left steps 16-17 all malformed and
    # step 23 at 0.58 on the way to 0.92).
    negated = train(tokenizer, warm, SINGLE, tmp_path / "negated", STEPS)
    assert negated.before == run.before  # the same warm start, the same held-out episodes
    assert negated.after <= run.before + 0.05, f"negated advantages improved success: {run.before:.2f} -> " \
                                               f"{negated.after:.2f}"
    assert len(shared_programs) == 1  # one update program, no log-prob pass, none compiled twice
    assert np.isfinite(run.mean("train/pg_loss", range(1, STEPS + 1)))
