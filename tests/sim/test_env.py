import dataclasses
import random

import pytest

from sim.env import ShopEnv
from sim.policies import OraclePolicy, run_episode


def env_for(world, **kw) -> ShopEnv:
    return ShopEnv(world, dataclasses.replace(world.config.env, **kw))


def first_task_with(world, pred):
    return next(int(t) for t in world.splits.test if pred(world.catalog.tasks[int(t)]))


def test_search_results_pagination_and_prev(world):
    env = env_for(world, results_top_n=50, page_size=20)
    task_id = int(world.splits.test[0])
    env.reset(task_id)
    obs = env.step("search[" + env.task.product_type + "]").observation
    assert obs.startswith("Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next >")
    assert "< Prev" not in obs
    page1 = env.available_actions()["clickables"]
    assert len([c for c in page1 if c.isdigit()]) == 20
    env.step("click[Next >]")
    assert env.page.page == 2 and "< prev" in env.available_actions()["clickables"]
    env.step("click[next >]")
    assert env.page.page == 3 and "next >" not in env.available_actions()["clickables"]
    assert len([c for c in env.available_actions()["clickables"] if c.isdigit()]) == 10
    env.step("click[< prev]")
    assert env.page.page == 2
    asin = [c for c in env.available_actions()["clickables"] if c.isdigit()][0]
    env.step(f"click[{asin}]")
    assert env.page.kind == "item"
    env.step("click[features]")
    assert env.page.kind == "detail"
    env.step("click[< prev]")
    assert env.page.kind == "item"
    env.step("click[< prev]")
    assert env.page.kind == "results" and env.page.page == 2
    env.step("click[back to search]")
    assert env.page.kind == "start" and env.available_actions() == {"has_search_bar": True, "clickables": []}
    assert env.stats.searches == 1 and env.stats.product_visits == 1 and env.stats.invalid_actions == 0


def test_invalid_actions_change_nothing_and_are_counted(world):
    env = env_for(world)
    env.reset(int(world.splits.test[1]))
    env.step("search[" + env.task.product_type + "]")
    before = env.page
    for bad in ("search[again]", "click[not a button]", "buy now", "click[]", "ask[hello]", "", "x" * 5000,
                "click[buy now]"):
        r = env.step(bad)
        assert r.observation.startswith("Invalid action:") and not r.done
        assert env.page == before
    assert env.stats.invalid_actions == 8


def test_buy_requires_every_option_axis_unless_disabled(world):
    task_id = first_task_with(world, lambda t: len(t.options) == 2)
    for required in (True, False):
        env = env_for(world, require_all_options=required)
        env.reset(task_id)
        env.step("search[x " + env.task.title + "]")
        env.step(f"click[{env.task.asin}]")
        env.step(f"click[{next(iter(env.task.options.values()))}]")
        r = env.step("click[buy now]")
        assert r.done is (not required)
        if required:
            assert "choose an option for every axis" in r.observation


def test_option_refresh_shows_the_sku_price_and_does_not_count_as_a_visit(world):
    task_id = first_task_with(world, lambda t: len(t.options) == 2)
    env = env_for(world)
    env.reset(task_id)
    env.step("search[" + env.task.title + "]")
    env.step(f"click[{env.task.asin}]")
    product = world.catalog[world.catalog.index_of(env.task.asin)]
    for axis, value in env.task.options.items():
        obs = env.step(f"click[{value.upper()}]").observation  # clicks are case-insensitive
    assert f"Price: {product.sku_price(env.task.options):.2f}" in obs or f"价格: {product.sku_price(env.task.options):.2f}" in obs
    assert env.stats.product_visits == 1
    assert dict(env.page.selected) == dict(env.task.options)


def test_step_limit_truncates_with_zero_reward(world):
    env = env_for(world, max_steps=3)
    env.reset(int(world.splits.test[2]))
    results = [env.step("click[nothing]") for _ in range(3)]
    assert results[-1].done and results[-1].reward == 0.0 and env.stats.truncated
    with pytest.raises(RuntimeError, match="finished episode"):
        env.step("search[x]")


def test_single_turn_persona_hides_the_requirement_and_shows_the_profile(world):
    task_id = first_task_with(world, lambda t: t.is_persona)
    env = env_for(world, persona=True)
    r = env.reset(task_id)
    view = r.info["view"]
    assert view["instruction"] == env.task.instruction_sample != env.task.instruction
    assert view["user_persona"] == env.task.user_persona
    assert "reason_key" not in view and "goal_options" not in view
    assert env.task.instruction_sample in r.observation


def test_multi_turn_shopper_opens_vaguely_and_answers_only_what_is_asked(world_en):
    task_id = first_task_with(world_en, lambda t: not t.is_persona and "color" in t.options and "size" in t.options)
    env = env_for(world_en, mode="multi")
    r = env.reset(task_id)
    task = env.task
    assert r.observation.startswith(f"Shopper: {task.instruction_simple}")
    assert task.instruction not in r.observation
    reply = env.step("ask[What color do you like?]").observation.split("\n")[0]
    assert task.options["color"] in reply and task.options["size"] not in reply and "budget" not in reply
    reply = env.step("ask[What's your budget?]").observation.split("\n")[0]
    assert f"{task.price_upper:.2f}" in reply and task.options["color"] not in reply
    assert env.stats.questions == 2
    assert set(env.shopper.tracker.missing()) == {"kind", "attributes", "size"}


@pytest.mark.parametrize("enforce", [True, False])
def test_premature_purchase_is_refused_by_the_shopper(world_en, enforce):
    task_id = first_task_with(world_en, lambda t: not t.is_persona and t.options)
    env = env_for(world_en, mode="multi", enforce_confirmation=enforce)
    env.reset(task_id)
    env.step("search[" + env.task.title + "]")
    env.step(f"click[{env.task.asin}]")
    for value in env.task.options.values():
        env.step(f"click[{value}]")
    r = env.step("click[buy now]")
    if enforce:
        assert not r.done and "information isn't complete" in r.observation and "budget" in r.observation
        assert env.stats.refused_purchases == 1
    else:
        assert r.done and env.stats.unconfirmed_purchase
        assert r.info["stats"]["unconfirmed_purchase"] is True


def test_persona_shopper_answers_as_usual_for_the_hidden_requirement(world):
    task_id = first_task_with(world, lambda t: t.is_persona and t.hidden_aspect == "price")
    env = env_for(world, mode="multi", persona=True)
    env.reset(task_id)
    q = "What is your budget?" if world.catalog.lang == "en" else "您的预算是多少？"
    reply = env.step(f"ask[{q}]").observation.split("\n")[0]
    assert ("as I usually do" in reply) or ("以往的习惯" in reply)
    assert f"{env.task.price_upper:.2f}" not in reply


def test_oracle_completes_every_mode(world):
    for kw in ({}, {"persona": True}, {"mode": "multi"}, {"mode": "multi", "persona": True, "enforce_confirmation": True}):
        env = env_for(world, **kw)
        wins = [run_episode(env, OraclePolicy(), int(t))["reward_detail"]["success"] for t in world.splits.test[:40]]
        assert sum(wins) / len(wins) >= 0.95, kw


def _adversarial_actions(rng: random.Random, env: ShopEnv):
    pieces = ["search[", "click[", "ask[", "]", "[", "buy now", "next >", "< prev", "<|im_end|>", "<tool_call>",
              "\x00", "\n", "💥", "乳胶", "Ｂｕｙ Ｎｏｗ", "\u202e", "' OR 1=1 --", "%s%n", " " * 3]
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.3:
            yield "".join(rng.choice(pieces) for _ in range(rng.randint(1, 8)))
        elif kind < 0.5:
            yield "".join(chr(rng.randint(0, 0x10FFFF)) for _ in range(rng.randint(0, 30))
                          ).encode("utf-16", "surrogatepass").decode("utf-16", "ignore")
        elif kind < 0.55:
            yield "search[" + "[" * rng.randint(1, 500) + "x" + "]" * rng.randint(1, 500) + "]"
        elif kind < 0.6:
            yield "click[" + "a" * rng.randint(1000, 200_000) + "]"
        else:
            clickables = env.available_actions()["clickables"]
            if clickables and rng.random() < 0.8:
                yield f"click[{rng.choice(clickables)}]"
            else:
                yield f"search[{rng.choice(pieces)}{rng.choice(pieces)}]"


@pytest.mark.parametrize("mode", ["single", "multi"])
def test_fuzz_thousands_of_adversarial_actions_never_crash(world, mode):
    env = env_for(world, mode=mode, max_steps=60)
    rng = random.Random(1234)
    env.reset(int(world.splits.train[0]))
    n_done = 0
    for action in _adversarial_actions(rng, env):
        r = env.step(action)
        assert isinstance(r.observation, str) and isinstance(r.reward, float) and 0.0 <= r.reward <= 1.0
        assert env.stats.steps <= 60
        if r.done:
            n_done += 1
            assert "reward_detail" in r.info
            env.reset(int(world.splits.train[rng.randrange(len(world.splits.train))]))
    assert n_done > 10
