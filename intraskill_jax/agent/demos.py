"""Oracle demonstrations through the exact agent-loop format (warm-start SFT data, upper bound).

The simulator's `OraclePolicy` picks each action; a `ScriptedEngine` writes it as the policy
family's tool call (`AgentConfig.tool_format`), so the demonstration tokens are what the policy
itself would have to sample. A demonstration of recovery (`mistakes`) is played by
`RecoveringOraclePolicy`: it makes one of a policy's mistakes first and recovers; the mistaken
replies stay in the context and out of the loss (their loss-mask is 0), so SFT trains the recovery
and never the mistake.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


from sim.env import ShopEnv
from sim.policies import OraclePolicy, RecoveringOraclePolicy

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import IM_END, ToolFormat, format_tool_calls, from_env_action


def oracle_engine(envs: Sequence[ShopEnv], tokenizer: Any, tool_format: ToolFormat, prefix: str,
                  mistakes: Sequence[str | None] | None = None) -> tuple[ScriptedEngine, dict[str, OraclePolicy]]:
    """The engine, and the policy of each session it has played (`mistakes[i]`: env i's mistake)."""
    policies: dict[str, OraclePolicy] = {}

    def script(session: str, _ids: Sequence[int]) -> str:
        i = int(session.removeprefix(prefix + "-"))
        env = envs[i]
        policy = policies.get(session)
        if policy is None:
            mistake = mistakes[i] if mistakes is not None else None
            policy = policies[session] = OraclePolicy() if mistake is None else RecoveringOraclePolicy(mistake)
            policy.reset(env, "")
        return format_tool_calls([from_env_action(policy.act(env, ""))], tool_format)

    stop = tokenizer.convert_tokens_to_ids(IM_END)
    return ScriptedEngine(lambda text: tokenizer.encode(text, add_special_tokens=False), script, stop), policies


def oracle_demonstrations(envs: Sequence[ShopEnv], tokenizer: Any, specs: Sequence[EpisodeSpec],
                          config: AgentConfig, *, prefix: str = "demo",
                          mistakes: Sequence[str | None] | None = None) -> list[Trajectory]:
    """The oracle's episodes; `mistakes[i]` ('buy_early', 'wrong_product' or None) makes episode i
    a demonstration of recovery, its mistaken replies masked out of the loss."""
    if mistakes is not None and len(mistakes) != len(specs):
        raise ValueError(f"one mistake (or None) per episode: {len(mistakes)} for {len(specs)} episodes")
    engine, policies = oracle_engine(envs, tokenizer, config.tool_format, prefix, mistakes)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=min(512, config.max_context_tokens - 1))
    trajs = run_episodes(engine, envs, tokenizer, specs, sampling, config, episode_prefix=prefix)
    for t in trajs:
        policy = policies.get(t.episode_id)
        if isinstance(policy, RecoveringOraclePolicy):
            mask_replies(t, policy.mistakes)
    return trajs


def mask_replies(traj: Trajectory, turns: Sequence[int]) -> None:
    """Leaves the replies of `turns` (0-based) out of the loss."""
    spans = traj.reply_spans()
    for turn in turns:
        if turn >= len(spans):
            raise ValueError(f"{traj.episode_id} has {len(spans)} replies; cannot mask reply {turn}")
        a, b = spans[turn]
        traj.loss_mask[a:b] = [0] * (b - a)


ACTION_KINDS = ("search", "product", "option", "navigate", "buy", "ask")
_NAVIGATION = frozenset({"next >", "< prev", "back to search", "description", "features", "reviews"})


def action_kind(action: str, catalog: Any, result_labels: str = "asin") -> str:
    """The decision an env action makes: one of ACTION_KINDS. `result_labels` is the env's
    (`EnvConfig.result_labels`): with 'rank', a click on a number opens a product."""
    verb, _, rest = action.partition("[")
    if verb in ("search", "ask"):
        return verb
    value = rest.removesuffix("]").strip().lower()
    if value == "buy now":
        return "buy"
    if value in _NAVIGATION:
        return "navigate"
    if catalog.index_of(value) is not None or (result_labels == "rank" and value.isdigit()):
        return "product"
    return "option"
