import dataclasses

import numpy as np
import pytest

from sim.config import SimConfig
from sim.env import ShopEnv
from sim.policies import HeuristicPolicy, OraclePolicy, RecoveringOraclePolicy, run_episode
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


@pytest.mark.parametrize("mistake", RecoveringOraclePolicy.MISTAKES)
def test_recovering_oracle_makes_its_mistake_then_recovers_and_buys_what_the_oracle_would(default_world, mistake):
    env = ShopEnv(default_world, dataclasses.replace(default_world.config.env, result_labels="rank", page_size=5,
                                                     show_detail_pages=False))
    made = 0
    for task_id in (int(t) for t in default_world.splits.train[:60]):
        result = env.reset(task_id)
        policy = RecoveringOraclePolicy(mistake)
        policy.reset(env, result.observation)
        steps = []  # (action, page kind before it, observation after it)
        while not result.done:
            kind, product = env.page.kind, env.page.product
            action = policy.act(env, result.observation)
            result = env.step(action)
            steps.append((action, kind, product, result.observation))
        assert result.info["reward_detail"]["success"] == 1.0, steps
        if not policy.mistakes:
            continue
        made += 1
        first = policy.mistakes[0]
        if mistake == "buy_early":
            assert policy.mistakes == [first]
            action, kind, _, observation = steps[first]
            assert (action, kind) == ("click[buy now]", "item")
            assert observation.startswith("Invalid action: choose an option for every axis before buying")
            assert steps[first + 1][0] != "click[buy now]"  # the axis it named is chosen next
        else:
            assert policy.mistakes == [first, first + 1]
            (opened, kind, _, _), (value_click, _, product, observation), back = steps[first : first + 3]
            assert kind == "results" and opened.startswith("click[")
            offered = {o.value for values in default_world.catalog[product].options.values() for o in values}
            assert value_click[len("click["):-1] in set(env.task.options.values()) - offered
            assert "is not clickable on this page" in observation
            assert back[0] == "click[< prev]" and back[3].startswith("Back to Search [SEP] Page")
    # Nearly every product has an option axis; a result lacking a requested value is on most first pages.
    assert made >= (55 if mistake == "buy_early" else 40), made
