"""Runs simulator episodes with a rollout engine, as token-in-token-out trajectories.

All episodes of a call advance in lockstep: each round sends every active episode's full token
history to the engine in one batch (engines reuse what they hold per session), parses each reply,
steps the environment, and appends the observation tokens. Episodes that finish leave the batch.

A reply that is not exactly a well-formed tool call never raises: it gets an error observation
and the turn records a *repair*; the episode goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from sim import render, reward

from intraskill_jax import distributed
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.agent.trajectory import Trajectory, Turn
from intraskill_jax.rollout.base import GenerateRequest, RolloutEngine, SamplingParams
from intraskill_jax.tokenization import (
    CONTROL_MARKUP,
    IM_END,
    TOOL_FORMATS,
    ToolFormat,
    ToolText,
    continuation_text,
    parse_reply,
    prompt_ids,
    to_env_action,
    tools_for,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class AgentConfig:
    """Episode limits and rendering.

    Attributes:
      tool_format: how the policy writes tool calls ('xml' Qwen3.5, 'json' Qwen3). A run config
        leaves it unset: it follows the policy's model family, read from its config.json when
        the policy is loaded (`RunConfig.for_policy`); a value set there must agree.
      enable_thinking: the chat template's thinking switch (Qwen: the generation prompt opens a
        think block for the policy to fill, or writes an empty one). `tokenization.check_template`
        refuses a template that would drop the reasoning from history under the chosen setting.
      tool_preamble: how the tools are written into the system turn when the policy's chat template
        has no tool branch (SmolLM2's ChatML; calls are then written into the replies too):
        'full' (the family's preamble with each tool's JSON schema, ~300 tokens) or 'compact'
        (one line of signatures and the call format, ~40 tokens). A template that renders tools
        itself ignores it.
      max_turns: agent turns (model replies) before the episode is cut with no purchase.
      max_consecutive_repairs: cut the episode (no purchase) after this many malformed replies in a
        row; 0 never cuts. A policy that has not written one valid call in k turns rarely writes
        one later (a pretrained model that answers in prose), and each such turn costs a full reply.
      max_context_tokens: the conversation may not outgrow this (prompt + all turns + next reply).
      max_observation_chars: observations are cut to this many characters (keeps context bounded).
      show_affordances: append ShopSimulator's "search available / clickable buttons" lines.
    """

    tool_format: ToolFormat | None = None
    enable_thinking: bool = False
    tool_preamble: Literal["full", "compact"] = "full"
    max_turns: int = 20
    max_consecutive_repairs: int = 0
    max_context_tokens: int = 8192
    max_observation_chars: int = 3000
    show_affordances: bool = True

    def __post_init__(self) -> None:
        if self.tool_format not in (None, *TOOL_FORMATS):
            raise ValueError(f"agent.tool_format must be one of {TOOL_FORMATS} (or unset), got {self.tool_format!r}")
        if self.tool_preamble not in ("full", "compact"):
            raise ValueError(f"agent.tool_preamble must be 'full' or 'compact', got {self.tool_preamble!r}")
        if self.max_consecutive_repairs < 0:
            raise ValueError(f"agent.max_consecutive_repairs must be >= 0 (0: no limit), got {self.max_consecutive_repairs}")
        if self.max_turns < 1 or self.max_context_tokens < 64 or self.max_observation_chars < 100:
            raise ValueError("need max_turns >= 1, max_context_tokens >= 64, max_observation_chars >= 100")


    def tool_text(self) -> ToolText:
        """How the tools and calls are written where the template has no tool branch."""
        if self.tool_format is None:
            raise ValueError("agent.tool_format is unset: take it from the policy (RunConfig.for_policy)")
        return ToolText(self.tool_format, self.tool_preamble)


class Env(Protocol):
    """What the episode runner needs of an environment (`sim.env.ShopEnv` is the real one).

    `reset(task_id)` returns the first page with `info["view"]` (what the agent may know, e.g. a
    `user_persona`); `step(action)` takes one WebShop-grammar action; a finished step's info holds
    `reward_detail` (the reward components, `success` among them) and `stats` (a dict).
    """

    lang: str
    config: Any  # EnvConfig: mode and reward are read
    stats: Any  # a dataclass of episode counters
    done: bool

    def reset(self, task_id: int) -> Any: ...

    def step(self, action: str) -> Any: ...

    def available_actions(self) -> dict[str, Any]: ...


@dataclasses.dataclass(frozen=True)
class SkillContext:
    """What an episode sees besides its task: the skill text in its system prompt and the mask over
    the bank's active chunks that rendered it. The siblings of a group share one."""

    skill_text: str = ""
    skill_mask: tuple[int, ...] = ()


@dataclasses.dataclass(frozen=True)
class EpisodeSpec:
    """One episode to run: the task, its group, and its group's skill context."""

    task_id: int
    group: int = 0
    context: SkillContext = SkillContext()


def group_specs(task_ids: Sequence[int], contexts: Sequence[SkillContext], *, siblings: int = 1,
                first_group: int = 0) -> list[EpisodeSpec]:
    """`siblings` episodes of each (task, context), contiguous; group k is `first_group + k`."""
    if len(task_ids) != len(contexts):
        raise ValueError(f"one context per group: {len(task_ids)} tasks, {len(contexts)} contexts")
    return [EpisodeSpec(int(task), group=first_group + k, context=ctx)
            for k, (task, ctx) in enumerate(zip(task_ids, contexts)) for _ in range(siblings)]


def run_groups(engine: RolloutEngine, make_env: Callable[[], Env], tokenizer: Any, task_ids: Sequence[int],
               contexts: Sequence[SkillContext], sampling: SamplingParams, config: AgentConfig, *,
               siblings: int = 1, first_group: int = 0, prefix: str = "ep",
               max_concurrent: int | None = None, on_done: Callable[[int], None] | None = None) -> list[Trajectory]:
    """Plays `siblings` episodes of each (task, context), each in a fresh `make_env()`, siblings
    contiguous: the one way training, the gate and evaluation roll out."""
    specs = group_specs(task_ids, contexts, siblings=siblings, first_group=first_group)
    return run_episodes(engine, [make_env() for _ in specs], tokenizer, specs, sampling, config,
                        episode_prefix=prefix, max_concurrent=max_concurrent, on_done=on_done)


def run_episodes(
    engine: RolloutEngine,
    envs: Sequence[Env],
    tokenizer: Any,
    specs: Sequence[EpisodeSpec],
    sampling: SamplingParams,
    config: AgentConfig,
    *,
    episode_prefix: str = "ep",
    max_concurrent: int | None = None,
    on_done: Callable[[int], None] | None = None,
) -> list[Trajectory]:
    """Plays `specs[i]` in `envs[i]` to the end (purchase, env step limit, turn or context limit).

    `tokenizer` is an HF tokenizer whose chat template renders the prompt; episode ids are
    f"{episode_prefix}-{i}", which engines see as the request session. At most `max_concurrent`
    episodes are in flight (the engine's batch capacity); when one finishes the next waiting one
    starts in the following round (continuous batching), in spec order, so a run is reproducible.
    `on_done(n)` is told after each round that ended `n` episodes (a progress display's units).

    On several processes every process calls it: an engine whose `generate` is a collective
    (the embedded sampler on the global mesh) is driven by all of them in lockstep; a host-side
    client is driven by process 0 alone, whose episodes the others receive.
    """
    if len(envs) != len(specs):
        raise ValueError(f"need one env per episode: {len(envs)} envs for {len(specs)} specs")
    if config.tool_format is None:
        raise ValueError("agent.tool_format is unset: take it from the policy (RunConfig.for_policy(path) "
                         "reads its family from config.json) or name the policy's format")
    if sampling.max_new_tokens >= config.max_context_tokens:
        raise ValueError(
            f"sampling.max_new_tokens ({sampling.max_new_tokens}) must be below agent.max_context_tokens "
            f"({config.max_context_tokens})"
        )
    if max_concurrent is not None and max_concurrent < 1:
        raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
    # A reply ends with the chat template's end-of-turn token, whatever else the caller stops on.
    end_of_turn = tokenizer.convert_tokens_to_ids(IM_END)
    if end_of_turn not in sampling.stop_token_ids:
        sampling = dataclasses.replace(sampling, stop_token_ids=(*sampling.stop_token_ids, end_of_turn))
    play = lambda: _play(engine, envs, tokenizer, specs, sampling, config, episode_prefix,  # noqa: E731
                         max_concurrent or len(specs), on_done)
    return play() if engine.collective else distributed.from_main(play)


def _play(engine: RolloutEngine, envs: Sequence[Env], tokenizer: Any, specs: Sequence[EpisodeSpec],
          sampling: SamplingParams, config: AgentConfig, episode_prefix: str, capacity: int,
          on_done: Callable[[int], None] | None) -> list[Trajectory]:
    trajs: list[Trajectory | None] = [None] * len(specs)
    waiting = list(range(len(specs)))[::-1]
    active: list[int] = []
    while True:
        ended = 0  # this round's, for `on_done`
        while waiting and len(active) < capacity:
            i = waiting.pop()
            trajs[i] = t = _start(envs[i], tokenizer, specs[i], config, f"{episode_prefix}-{i}")
            if t.done:  # its prompt alone filled the context
                ended += 1
            else:
                active.append(i)
        if active:
            completions = engine.generate([GenerateRequest(trajs[i].episode_id, trajs[i].token_ids) for i in active],
                                          sampling)
            if len(completions) != len(active):
                raise RuntimeError(f"engine returned {len(completions)} completions for {len(active)} requests")
            still = []
            for i, completion in zip(active, completions):
                _advance(envs[i], trajs[i], completion, tokenizer, sampling, config)
                if trajs[i].done:
                    engine.release(trajs[i].episode_id)
                else:
                    still.append(i)
            ended += len(active) - len(still)
            active = still
        if on_done is not None and ended:
            on_done(ended)
        if not active and not waiting:
            break
    return trajs


def _start(env: Env, tokenizer: Any, spec: EpisodeSpec, config: AgentConfig, episode_id: str) -> Trajectory:
    first = env.reset(spec.task_id)
    view = first.info["view"]
    system = system_prompt(env.lang, env.config.mode, spec.context.skill_text, view.get("user_persona"))
    messages = [{"role": "system", "content": system}, {"role": "user", "content": _observation(env, first.observation, config)}]
    prompt = prompt_ids(tokenizer, messages, tools=tools_for(env.config.mode), enable_thinking=config.enable_thinking,
                        tool_text=config.tool_text())
    traj = Trajectory(
        episode_id=episode_id, task_id=spec.task_id, group=spec.group, skill_mask=tuple(spec.context.skill_mask),
        token_ids=[], loss_mask=[], logprobs=[], prompt_length=len(prompt),
    )
    traj.append(prompt, sampled=False)
    if len(prompt) >= config.max_context_tokens:
        _end(traj, env, None, truncated="context")
    return traj


def _observation(env: Env, text: str, config: AgentConfig) -> str:
    # Observations come from outside the policy: strip chat markup so they cannot forge turns.
    text = CONTROL_MARKUP.sub(" ", text)[: config.max_observation_chars]
    if config.show_affordances and not env.done:
        actions = env.available_actions()
        text += "\n" + render.affordances(env.lang, actions["has_search_bar"], actions["clickables"])
    return text


def _advance(env: Env, traj: Trajectory, completion: Any, tokenizer: Any, sampling: SamplingParams,
             config: AgentConfig) -> None:
    traj.append(completion.token_ids, sampled=True, logprobs=completion.logprobs)
    traj.weight_versions.append(completion.weight_version)
    turn = Turn(generated_tokens=len(completion.token_ids))
    traj.turns.append(turn)
    text = tokenizer.decode(completion.token_ids, skip_special_tokens=False)
    reply = parse_reply(text, config.tool_format)
    if completion.finish_reason == "length":
        reply = dataclasses.replace(reply, calls=(), error=f"reply cut at {sampling.max_new_tokens} tokens")
    responses: list[str] = []
    if reply.error is not None:
        turn.repair = reply.error
        responses.append(f"Error: {reply.error}")
    for call in reply.calls:
        try:
            action = to_env_action(call)
        except ValueError as e:
            turn.repair = str(e)
            responses.append(f"Error: {e}")
            break
        turn.tool, turn.arguments, turn.action = call.name, dict(call.arguments), action
        result = env.step(action)
        responses.append(_observation(env, result.observation, config))
        if result.done:
            _end(traj, env, result.info)
            return
    if len(traj.turns) >= config.max_turns:
        _end(traj, env, None, truncated="turns")
        return
    limit = config.max_consecutive_repairs
    if limit and len(traj.turns) >= limit and all(t.repair is not None for t in traj.turns[-limit:]):
        _end(traj, env, None, truncated="repairs")
        return
    text = continuation_text(tool_responses=responses, enable_thinking=config.enable_thinking, tokenizer=tokenizer)
    ids = tokenizer.encode(text, add_special_tokens=False)
    turn.observation_chars = sum(len(r) for r in responses)
    turn.observation_tokens = len(ids)
    if len(traj.token_ids) + len(ids) + sampling.max_new_tokens > config.max_context_tokens:
        _end(traj, env, None, truncated="context")
        return
    traj.append(ids, sampled=False)


def _end(traj: Trajectory, env: Env, info: dict[str, Any] | None,
         truncated: Literal["turns", "context", "repairs"] | None = None) -> None:
    traj.done = True
    if info is not None:
        traj.reward_detail = dict(info["reward_detail"])
        traj.env_stats = dict(info["stats"])
        if traj.env_stats.get("truncated"):
            traj.truncated = "env_steps"
    else:
        traj.reward_detail = reward.NO_PURCHASE.to_dict()
        traj.env_stats = dataclasses.asdict(env.stats)
        traj.truncated = truncated
    strict = env.config.reward == "strict"
    traj.reward = float(traj.reward_detail["strict" if strict else "loose"])
