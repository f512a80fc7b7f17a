"""The GRPO loop end to end on a tiny model: update, weight push, metrics, checkpoint, resume."""

import json

import numpy as np
import pytest
from flax import nnx

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax.agent.episode import AgentConfig
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rl.learner import Learner, LearnerConfig, TaskCursor
from intraskill_jax.rl.rollouts import GroupContext
from intraskill_jax.rl.train_step import OptimConfig
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action, train_tokenizer


class MixedEngine(ScriptedEngine):
    """Odd siblings play the oracle, even ones talk: every group has reward variance."""

    def __init__(self, world, tok):
        self.world, self.pushed, self.policies = world, [], {}
        super().__init__(lambda s: tok.encode(s, add_special_tokens=False), self._script, tok.convert_tokens_to_ids(IM_END))

    def _script(self, session, ids):
        i = int(session.rsplit("-", 1)[1])
        if i % 2 == 0:
            return "hmm"
        policy, env = self.policies[session]
        return format_tool_calls([from_env_action(policy.act(env, ""))], "qwen3_5")

    def set_weights(self, model, version):
        self.pushed.append(version)


@pytest.fixture(scope="module")
def world_tok():
    world = build_world(SimConfig(catalog=CatalogConfig(num_products=1200), splits=SplitConfig(num_test=20, num_validation=20)))
    tok = train_tokenizer([world.catalog[i].title for i in range(0, 1200, 2)], vocab_size=1500)
    return world, tok


def make(world, tok, workdir, engine, steps=3):
    cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tok))
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    seen = []

    def contexts(step, tasks):
        seen.append((step, list(tasks)))
        return [GroupContext("Compare prices.", (1,)) for _ in tasks]

    learner = Learner(
        model, tok, world, engine, workdir,
        config=LearnerConfig(steps=steps, groups_per_step=2, group_size=2, checkpoint_every=2,
                             sampling=SamplingParams(temperature=1.0, max_new_tokens=96)),
        optim=OptimConfig(learning_rate=1e-3), loss=LossConfig(), agent=AgentConfig(max_turns=10, max_context_tokens=4096, max_observation_chars=400),
        contexts_fn=contexts)
    return learner, seen


def patch_envs(engine, monkeypatch):
    """Give the scripted oracle access to each episode's env (created inside `collect`)."""
    import intraskill_jax.rl.rollouts as rollouts

    real = rollouts.run_episodes

    def spy(eng, envs, tok, specs, sampling, agent, *, episode_prefix, **kw):
        for i, env in enumerate(envs):
            engine.policies[f"{episode_prefix}-{i}"] = (_Lazy(env), env)
        return real(eng, envs, tok, specs, sampling, agent, episode_prefix=episode_prefix, **kw)

    monkeypatch.setattr(rollouts, "run_episodes", spy)


class _Lazy(OraclePolicy):
    def __init__(self, env):
        self._env, self._ready = env, False

    def act(self, env, observation):
        if not self._ready:
            self.reset(env, observation)
            self._ready = True
        return super().act(env, observation)


def test_steps_update_push_log_checkpoint_and_resume_identically(world_tok, tmp_path, monkeypatch):
    world, tok = world_tok
    engine = MixedEngine(world, tok)
    patch_envs(engine, monkeypatch)
    full, seen = make(world, tok, tmp_path / "full", engine)
    full.run(progress=False)
    rows = [json.loads(line) for line in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    # A step updates exactly when some group had reward variance.
    assert all(r["train/updated"] == float(r["rollout/zero_variance_drop_rate"] < 1.0) for r in rows)
    updated = [r for r in rows if r["train/updated"]]
    assert updated and all(np.isfinite(r["train/pg_loss"]) and r["train/grad_norm"] > 0 for r in updated)
    assert engine.pushed == [1, 2, 3] and full.checkpoints.all_steps() == [2, 3]
    assert [s for s, _ in seen] == [0, 1, 2]
    full.close()

    # Interrupted after step 2 (its checkpoint), resumed in a new process-equivalent learner.
    part_engine = MixedEngine(world, tok)
    patch_envs(part_engine, monkeypatch)
    part, _ = make(world, tok, tmp_path / "part", part_engine)
    part.run(steps=2, progress=False)
    part.close()
    resumed, seen2 = make(world, tok, tmp_path / "part", part_engine)
    assert resumed.step == 2 and resumed.cursor.position == 4
    resumed.run(progress=False)
    resumed.close()
    rows_part = [json.loads(line) for line in (tmp_path / "part" / "metrics.jsonl").read_text().splitlines()]
    assert seen2 == [(2, seen[2][1])]  # the same tasks as the uninterrupted run's third step
    assert rows_part[-1].keys() == rows[-1].keys()
    for key in rows[-1]:
        if key.startswith(("train/", "rollout/")):
            assert rows_part[-1][key] == pytest.approx(rows[-1][key], rel=1e-5, abs=1e-7), key


def test_task_cursor_epochs_are_seeded_permutations():
    c = TaskCursor(range(10), seed=3)
    first, second = c.take(10), c.take(10)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    again = TaskCursor(range(10), seed=3, position=10)
    assert again.take(10) == second
