"""Oracle demonstrations through the exact agent-loop format (warm-start SFT data, upper bound).

The simulator's `OraclePolicy` picks each action; a `ScriptedEngine` writes it as the policy
family's tool call, so the demonstration tokens are what the policy itself would have to sample.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sim.env import ShopEnv
from sim.policies import OraclePolicy

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action


def oracle_engine(envs: Sequence[ShopEnv], tokenizer: Any, family: str, prefix: str) -> ScriptedEngine:
    policies: dict[str, OraclePolicy] = {}

    def script(session: str, _ids: Sequence[int]) -> str:
        env = envs[int(session.removeprefix(prefix + "-"))]
        policy = policies.get(session)
        if policy is None:
            policy = policies[session] = OraclePolicy()
            policy.reset(env, "")
        return format_tool_calls([from_env_action(policy.act(env, ""))], family)  # type: ignore[arg-type]

    stop = tokenizer.convert_tokens_to_ids(IM_END)
    return ScriptedEngine(lambda text: tokenizer.encode(text, add_special_tokens=False), script, stop)


def oracle_demonstrations(envs: Sequence[ShopEnv], tokenizer: Any, specs: Sequence[EpisodeSpec],
                          config: AgentConfig, *, prefix: str = "demo") -> list[Trajectory]:
    engine = oracle_engine(envs, tokenizer, config.family, prefix)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=min(512, config.max_context_tokens - 1))
    return run_episodes(engine, envs, tokenizer, specs, sampling, config, episode_prefix=prefix)
