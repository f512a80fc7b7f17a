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
