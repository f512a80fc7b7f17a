"""The agent loop against scripted engines: token bookkeeping, repairs, limits."""

import dataclasses

import numpy as np
import pytest

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.world import build_world

from intraskill_jax.agent.demos import oracle_demonstrations
from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, SkillContext, run_episodes
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.agent.trajectory import bucket_length, collate
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import (IM_END, ToolCall, format_tool_calls, from_env_action, parse_reply,
                                         to_env_action, train_tokenizer)


@pytest.fixture(scope="module")
def world():
    return build_world(SimConfig(catalog=CatalogConfig(num_products=1200, persona_fraction=0.5),
                                 splits=SplitConfig(num_test=60, num_validation=20)))


@pytest.fixture(scope="module", params=["xml", "json"])
def tok(request, world):
    texts = [world.catalog[i].title for i in range(0, 1200, 3)] + [world.catalog.tasks[i].instruction for i in range(0, 1200, 7)]
    t = train_tokenizer(texts * 2, vocab_size=800, tool_format=request.param)
    t.tool_format = request.param
    return t


def envs_for(world, n, **env):
    return [ShopEnv(world, dataclasses.replace(world.config.env, **env)) for _ in range(n)]


@pytest.mark.parametrize("env_kw", [{}, {"mode": "multi", "persona": True, "enforce_confirmation": True}])
def test_oracle_demonstrations_succeed_and_masks_cover_exactly_the_sampled_replies(world, tok, env_kw):
    specs = [EpisodeSpec(int(t), group=k // 4) for k, t in enumerate(world.splits.test[:12])]
    cfg = AgentConfig(tool_format=tok.tool_format)
    trajs = oracle_demonstrations(envs_for(world, len(specs), **env_kw), tok, specs, cfg)
    assert np.mean([t.success for t in trajs]) >= 0.95
    for t in trajs:
        assert t.done and t.truncated is None and t.repairs == 0
        assert len(t.token_ids) == len(t.loss_mask) == len(t.logprobs)
        assert t.loss_mask[: t.prompt_length] == [0] * t.prompt_length
        # Sampled spans decode to one well-formed call each, ending with <|im_end|>.
        spans, cur = [], []
        for tid, m in zip(t.token_ids, t.loss_mask):
            if m:
                cur.append(tid)
            elif cur:
                spans.append(cur)
                cur = []
        spans += [cur] if cur else []
        assert len(spans) == len(t.turns) == t.env_stats["steps"]
        for span, turn in zip(spans, t.turns):
            text = tok.decode(span, skip_special_tokens=False)
            assert text.endswith(IM_END)
            assert parse_reply(text, tok.tool_format).calls[0].name == turn.tool
            assert turn.generated_tokens == len(span)


def _sampled_spans(t):
    spans, cur = [], []
    for tid, m in zip([*t.token_ids, -1], [*t.loss_mask, 0]):
        if m:
            cur.append(tid)
        elif cur:
            spans, cur = [*spans, cur], []
    return spans


def test_recovery_demonstrations_keep_the_mistake_in_context_and_out_of_the_loss(world, tok):
    specs = [EpisodeSpec(int(t), group=k) for k, t in enumerate(world.splits.train[:12])]
    mistakes = ["buy_early", "wrong_product", None] * 4
    cfg = AgentConfig(tool_format=tok.tool_format, max_turns=14)
    trajs = oracle_demonstrations(envs_for(world, 12, result_labels="rank", page_size=5), tok, specs, cfg,
                                  mistakes=mistakes)
    made = 0
    for t, mistake in zip(trajs, mistakes):
        assert t.success and t.repairs == 0
        actions = [turn.action for turn in t.turns]
        if mistake == "buy_early" and actions.count("click[buy now]") == 2:
            mistaken = [actions.index("click[buy now]")]  # refused: an axis was unchosen
        elif mistake == "wrong_product" and "click[< prev]" in actions:
            back = actions.index("click[< prev]")
            mistaken = [back - 2, back - 1]  # the wrong product opened, the value it lacks clicked
        else:  # the oracle's own: no mistake asked for, or the page gave it no room
            mistaken = []
        made += bool(mistaken)
        trained = [to_env_action(parse_reply(tok.decode(span, skip_special_tokens=False), tok.tool_format).calls[0])
                   for span in _sampled_spans(t)]
        assert trained == [a for i, a in enumerate(actions) if i not in mistaken]
        # The mistaken replies are still in the conversation the recovery is conditioned on.
        text = tok.decode(t.token_ids, skip_special_tokens=False)
        for i in mistaken:
            assert format_tool_calls([from_env_action(actions[i])], tok.tool_format) in text
    assert made >= 6


def test_mistakes_must_match_the_episodes(world, tok):
    specs = [EpisodeSpec(int(t)) for t in world.splits.train[:2]]
    with pytest.raises(ValueError, match="one mistake"):
        oracle_demonstrations(envs_for(world, 2), tok, specs, AgentConfig(tool_format=tok.tool_format),
                              mistakes=["buy_early"])


def test_malformed_replies_are_repairs_and_turn_limit_ends_with_zero_reward(world, tok):
    stop = tok.convert_tokens_to_ids(IM_END)
    garbage = ["I think I should search.", "<tool_call>\n<function=search>", "<tool_call>\n{\"name\": 3}\n</tool_call>",
               "<tool_call>\n<function=fly>\n</function>\n</tool_call>", "<|im_start|>user\nforged"]
    n = {"i": 0}

    def script(session, ids):
        n["i"] += 1
        return garbage[n["i"] % len(garbage)]

    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), script, stop)
    cfg = AgentConfig(tool_format=tok.tool_format, max_turns=7)
    trajs = run_episodes(engine, envs_for(world, 3), tok, [EpisodeSpec(int(t)) for t in world.splits.test[:3]],
                         SamplingParams(max_new_tokens=64), cfg)
    for t in trajs:
        assert t.done and t.truncated == "turns" and t.reward == 0.0 and len(t.turns) == 7
        assert t.repairs == 7 and all(turn.action is None for turn in t.turns)
    assert sorted(engine.released) == sorted(t.episode_id for t in trajs)


def test_consecutive_repairs_cut_the_episode_only_when_uninterrupted(world, tok):
    """With agent.max_consecutive_repairs=3 an episode ends after the third malformed reply in a
    row; a valid call in between starts the count again."""
    stop = tok.convert_tokens_to_ids(IM_END)
    search = format_tool_calls([ToolCall("search", {"keywords": "pillow"})], tok.tool_format)
    back = format_tool_calls([ToolCall("click", {"value": "back to search"})], tok.tool_format)
    replies = ["prose", "prose", back, "prose", search, "prose", "prose", "prose", search]
    turn = iter(replies)
    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), lambda s, ids: next(turn), stop)
    cfg = AgentConfig(tool_format=tok.tool_format, max_turns=20, max_consecutive_repairs=3)
    (t,) = run_episodes(engine, envs_for(world, 1), tok, [EpisodeSpec(int(world.splits.test[0]))],
                        SamplingParams(max_new_tokens=64), cfg)
    assert [turn.repair is not None for turn in t.turns] == [True, True, False, True, False, True, True, True]
    assert t.done and t.truncated == "repairs" and t.reward == 0.0
    with pytest.raises(ValueError, match="max_consecutive_repairs"):
        AgentConfig(max_consecutive_repairs=-1)


def test_episodes_are_told_as_they_end(world, tok):
    """`on_done(n)` hears, after each round, how many episodes it ended: two at a time of five,
    the even ones ending at their second malformed reply, the odd ones at the 4-turn limit; an
    episode whose prompt alone fills the context is told at its start."""
    stop = tok.convert_tokens_to_ids(IM_END)
    search = format_tool_calls([ToolCall("search", {"keywords": "pillow"})], tok.tool_format)
    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False),
                            lambda session, ids: "prose" if int(session.split("-")[1]) % 2 == 0 else search, stop)
    cfg = AgentConfig(tool_format=tok.tool_format, max_turns=4, max_consecutive_repairs=2)
    specs = [EpisodeSpec(int(t)) for t in world.splits.test[:5]]
    told = []
    trajs = run_episodes(engine, envs_for(world, 5), tok, specs, SamplingParams(max_new_tokens=64), cfg,
                         max_concurrent=2, on_done=told.append)
    assert [t.truncated for t in trajs] == ["repairs", "turns", "repairs", "turns", "repairs"]
    # rounds: [0 1] [0 1] -> 0 | [1 2] [1 2] -> 1, 2 | [3 4] [3 4] -> 4 | [3] [3] -> 3
    assert told == [1, 2, 1, 1]
    told.clear()
    (t,) = run_episodes(engine, envs_for(world, 1), tok, specs[:1], SamplingParams(max_new_tokens=64),
                        dataclasses.replace(cfg, max_context_tokens=100), on_done=told.append)
    assert t.truncated == "context" and told == [1]


def test_context_limit_and_reply_length_limit(world, tok):
    stop = tok.convert_tokens_to_ids(IM_END)
    long = "<tool_call>\n<function=search>\n<parameter=keywords>\n" + "pillow " * 200 + "\n</parameter>\n</function>\n</tool_call>"
    engine = ScriptedEngine(lambda s: tok.encode(s, add_special_tokens=False), lambda s, i: long, stop)
    specs = [EpisodeSpec(int(world.splits.test[0]))]
    t = run_episodes(engine, envs_for(world, 1), tok, specs, SamplingParams(max_new_tokens=32),
                     AgentConfig(tool_format=tok.tool_format, max_turns=50))[0]
    assert t.turns[0].repair.startswith("reply cut at 32 tokens") and t.turns[0].generated_tokens == 32
    t = run_episodes(engine, envs_for(world, 1), tok, specs, SamplingParams(max_new_tokens=2000),
                     AgentConfig(tool_format=tok.tool_format, max_context_tokens=2400))[0]
    assert t.truncated == "context" and len(t.token_ids) <= 2400


def test_skill_text_and_mask_are_recorded_and_empty_skill_is_the_bare_prompt(world, tok):
    assert system_prompt("en", "single", "") == system_prompt("en", "single")
    assert "Compare prices." in system_prompt("en", "single", "Compare prices.")
    specs = [EpisodeSpec(int(world.splits.test[0]), group=3, context=SkillContext("Compare prices.", (1, 0, 1)))]
    t = oracle_demonstrations(envs_for(world, 1), tok, specs, AgentConfig(tool_format=tok.tool_format))[0]
    assert t.skill_mask == (1, 0, 1) and t.group == 3
    assert "Compare prices." in tok.decode(t.token_ids[: t.prompt_length])


def test_collate_buckets_and_aligns(world, tok):
    specs = [EpisodeSpec(int(t)) for t in world.splits.test[:4]]
    trajs = oracle_demonstrations(envs_for(world, 4), tok, specs, AgentConfig(tool_format=tok.tool_format))
    batch = collate(trajs, pad_id=tok.pad_token_id)
    L = batch["tokens"].shape[1]
    assert L == bucket_length(max(len(t.token_ids) for t in trajs)) and L % 128 == 0
    for i, t in enumerate(trajs):
        n = len(t.token_ids)
        assert batch["tokens"][i, :n].tolist() == t.token_ids
        assert batch["loss_mask"][i].sum() == sum(t.loss_mask)
        assert batch["attention_mask"][i].sum() == n
    assert [bucket_length(n) for n in (1, 128, 129, 257, 300, 385, 700, 1025, 1537)] == [
        128, 128, 256, 384, 384, 512, 768, 1536, 2048]
