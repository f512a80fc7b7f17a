import dataclasses

import numpy as np
import pytest

from sim.config import SimConfig
from sim.env import ShopEnv
from sim.policies import HeuristicPolicy, OraclePolicy, run_episode
from sim.world import build_world


@pytest.fixture(scope="module")
def default_world():
    return build_world(SimConfig())


def test_oracle_upper_bound_on_the_default_test_split(default_world):
    env = ShopEnv(default_world)
    assert len(default_world.splits.test) == 400
    oracle = [run_episode(env, OraclePolicy(), int(t))["reward_detail"]["success"] for t in default_world.splits.test]
    heuristic = [run_episode(env, HeuristicPolicy(), int(t))["reward_detail"]["success"] for t in default_world.splits.test]
    assert np.mean(oracle) >= 0.95
    # The non-oracle baseline must leave room to learn: it is clearly below the oracle.
    assert np.mean(heuristic) <= np.mean(oracle) - 0.1


def test_splits_are_fixed_disjoint_and_cover_every_task(default_world):
    s = default_world.splits
    again = build_world(SimConfig()).splits
    for name in ("train", "validation", "test"):
        np.testing.assert_array_equal(s[name], again[name])
    all_ids = np.concatenate([s.train, s.validation, s.test])
    assert len(np.unique(all_ids)) == len(all_ids) == len(default_world.catalog.tasks)
    with pytest.raises(KeyError, match="unknown split"):
        s["dev"]


def test_oracle_searches_so_its_first_result_is_the_one_it_opens(default_world):
    """The oracle's click must be explainable from the page: with the request's option values in its
    search, the first result offers them; a search of type and attributes alone leaves the product
    that satisfies the task further down, told apart from rank 1 only by options the page hides."""
    env = ShopEnv(default_world, dataclasses.replace(default_world.config.env, result_labels="rank", page_size=5))
    first = {"oracle": 0, "without options": 0}
    tasks = [int(t) for t in default_world.splits.test[:100]]
    for task_id in tasks:
        env.reset(task_id)
        oracle = OraclePolicy()
        oracle.reset(env, "")
        search = oracle.act(env, "")
        assert all(v in search for v in env.task.options.values())
        plain = "search[" + " ".join((env.task.product_type, *env.task.attributes)) + "]"
        for name, query in (("oracle", search), ("without options", plain)):
            env.reset(task_id)
            oracle.reset(env, "")
            env.step(query)
            first[name] += oracle.act(env, "") == "click[1]"
    assert first["oracle"] >= 0.7 * len(tasks)
    assert first["oracle"] - first["without options"] >= 0.3 * len(tasks)
