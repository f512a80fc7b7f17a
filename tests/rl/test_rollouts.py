"""Group collection: contiguous siblings, group-relative advantages, zero-variance filtering."""

import numpy as np
import pytest

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax.agent.episode import AgentConfig, SkillContext
from intraskill_jax.rl.rollouts import collect
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action, train_tokenizer


@pytest.fixture(scope="module")
def setup():
    world = build_world(SimConfig(catalog=CatalogConfig(num_products=1200), splits=SplitConfig(num_test=40, num_validation=20)))
    tok = train_tokenizer([world.catalog[i].title for i in range(0, 1200, 2)], vocab_size=600)
    return world, tok


def test_groups_advantages_and_zero_variance_filter(setup):
    world, tok = setup
    envs, policies = [], {}
    G = 4

    def make_env():
        envs.append(ShopEnv(world))
        return envs[-1]

    def script(session, ids):
        i = int(session.rsplit("-", 1)[1])
        group, sibling = divmod(i, G)
        # group 0: every sibling succeeds; group 1: siblings 0 and 2 succeed; group 2: all fail.
        if group == 2 or (group == 1 and sibling % 2):
            return "I am not sure."
        if i not in policies:
            policies[i] = OraclePolicy()
            policies[i].reset(envs[i], "")
        return format_tool_calls([from_env_action(policies[i].act(envs[i], ""))], "xml")

    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), script, tok.convert_tokens_to_ids(IM_END))
    tasks = [int(t) for t in world.splits.train[:3]]
    ctx = [SkillContext("skill A", (1, 0)), SkillContext(), SkillContext("skill B", (0, 1))]
    exp = collect(engine, make_env, tok, tasks, ctx, group_size=G, sampling=SamplingParams(max_new_tokens=128),
                  agent=AgentConfig(tool_format="xml", max_turns=12))
    rewards = np.array([t.reward for t in exp.trajectories])
    np.testing.assert_array_equal(rewards, [1, 1, 1, 1, 1, 0, 1, 0, 0, 0, 0, 0])
    assert [t.task_id for t in exp.trajectories] == [t for t in tasks for _ in range(G)]
    assert [t.skill_mask for t in exp.trajectories[::G]] == [(1, 0), (), (0, 1)]
    assert exp.admitted.tolist() == [False] * 4 + [True] * 4 + [False] * 4
    r = rewards[4:8]
    np.testing.assert_allclose(exp.advantages[4:8], (r - r.mean()) / (r.std(ddof=1) + 1e-6), rtol=1e-5)
    np.testing.assert_allclose(exp.advantages[:4], 0)
    np.testing.assert_allclose(exp.advantages[8:], 0)
    m = exp.metrics
    assert m["rollout/episodes_generated"] == 12 and m["rollout/episodes_admitted"] == 4
    assert m["rollout/zero_variance_drop_rate"] == pytest.approx(8 / 12)
    assert m["rollout/success"] == pytest.approx(6 / 12) and m["rollout/truncation_rate"] == pytest.approx(6 / 12)
    assert len(exp.train_trajectories) == 4 and exp.train_advantages.shape == (4,)


def test_all_wrong_groups_are_retried_with_the_full_skill_within_engine_capacity(setup):
    world, tok = setup
    envs, policies, batches = [], {}, []
    G = 4

    def make_env():
        envs.append(ShopEnv(world))
        return envs[-1]

    def script(session, ids):
        prefix, i = session.rsplit("-", 1)
        i = int(i)
        retry = prefix.endswith("r")
        # First pass: group 0 has one success, group 1 none. Retry of group 1: siblings 0, 1 succeed.
        wins = (i % G in (0, 1)) if retry else (i == 0)
        if not wins:
            return "no idea"
        env = envs[3 * G + i] if retry else envs[i]
        if session not in policies:
            policies[session] = OraclePolicy()
            policies[session].reset(env, "")
        return format_tool_calls([from_env_action(policies[session].act(env, ""))], "xml")

    class Counting(ScriptedEngine):
        def generate(self, requests, params):
            batches.append(len(requests))
            return super().generate(requests, params)

    engine = Counting(lambda s: tok.encode(s, add_special_tokens=False), script, tok.convert_tokens_to_ids(IM_END))
    tasks = [int(t) for t in world.splits.train[:3]]
    full = SkillContext("all chunks", (1, 1))
    # Group 2 ("no idea" everywhere, but with the same script as group 1) is all-wrong too.
    exp = collect(engine, make_env, tok, tasks, [SkillContext()] * 3, group_size=G, prefix="s",
                  sampling=SamplingParams(max_new_tokens=128), agent=AgentConfig(tool_format="xml", max_turns=12),
                  max_concurrent=5, retry=full)
    assert max(batches) <= 5
    first, again = exp.trajectories[:3 * G], exp.trajectories[3 * G:]
    assert [t.success for t in first] == [True] + [False] * 11
    assert len(again) == 2 * G and all(t.skill_mask == (1, 1) for t in again)
    assert [t.task_id for t in again] == [tasks[1]] * G + [tasks[2]] * G
    assert [t.group for t in again[::G]] == [3, 4]
    assert [t.success for t in again] == [True, True, False, False] * 2
    assert exp.retried.tolist() == [False] * 12 + [True] * 8
    # Only groups with reward variance train: group 0 and both retry groups.
    assert exp.admitted.tolist() == [True] * 4 + [False] * 8 + [True] * 8
    m = exp.metrics
    assert m["skills/retry_groups"] == 2 and m["skills/retry_recovered_groups"] == 2
    assert m["skills/retry_success_rate"] == pytest.approx(0.5)
