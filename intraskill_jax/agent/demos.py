"""Oracle demonstrations through the exact agent-loop format (warm-start SFT data, upper bound).

The simulator's `OraclePolicy` picks each action; a `ScriptedEngine` writes it as the policy
family's tool call (`AgentConfig.tool_format`), so the demonstration tokens are what the policy
itself would have to sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


from sim.env import ShopEnv
from sim.policies import OraclePolicy

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import IM_END, ToolFormat, format_tool_calls, from_env_action


def oracle_engine(envs: Sequence[ShopEnv], tokenizer: Any, tool_format: ToolFormat, prefix: str) -> ScriptedEngine:
    policies: dict[str, OraclePolicy] = {}

    def script(session: str, _ids: Sequence[int]) -> str:
        env = envs[int(session.removeprefix(prefix + "-"))]
        policy = policies.get(session)
        if policy is None:
            policy = policies[session] = OraclePolicy()
            policy.reset(env, "")
        return format_tool_calls([from_env_action(policy.act(env, ""))], tool_format)

    stop = tokenizer.convert_tokens_to_ids(IM_END)
    return ScriptedEngine(lambda text: tokenizer.encode(text, add_special_tokens=False), script, stop)


def oracle_demonstrations(envs: Sequence[ShopEnv], tokenizer: Any, specs: Sequence[EpisodeSpec],
                          config: AgentConfig, *, prefix: str = "demo") -> list[Trajectory]:
    engine = oracle_engine(envs, tokenizer, config.tool_format, prefix)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=min(512, config.max_context_tokens - 1))
    return run_episodes(engine, envs, tokenizer, specs, sampling, config, episode_prefix=prefix)


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
