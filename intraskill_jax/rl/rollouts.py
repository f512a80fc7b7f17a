"""One training step's experience: groups of sibling episodes, their advantages and the filter.

A *group* is G siblings of one task that share one context (the skill text and chunk mask chosen
for the group). Rewards become group-relative advantages; groups whose siblings all scored the
same carry no gradient and are dropped, with counters (generated vs admitted episodes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from sim.env import ShopEnv
from sim.world import World

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rl.grpo import group_advantages, nonzero_variance_groups
from intraskill_jax.rollout.base import RolloutEngine, SamplingParams


@dataclasses.dataclass(frozen=True)
class GroupContext:
    """What every sibling of a group sees besides the task (the skill text and its mask)."""

    skill_text: str = ""
    skill_mask: tuple[int, ...] = ()


@dataclasses.dataclass
class Experience:
    trajectories: list[Trajectory]  # all generated episodes, siblings contiguous
    advantages: np.ndarray  # [N] float32
    admitted: np.ndarray  # [N] bool: in a group with reward variance
    metrics: dict[str, float]

    @property
    def train_trajectories(self) -> list[Trajectory]:
        return [t for t, keep in zip(self.trajectories, self.admitted) if keep]

    @property
    def train_advantages(self) -> np.ndarray:
        return self.advantages[self.admitted]


def collect(
    engine: RolloutEngine,
    world: World,
    tokenizer: Any,
    task_ids: Sequence[int],
    contexts: Sequence[GroupContext],
    *,
    group_size: int,
    sampling: SamplingParams,
    agent: AgentConfig,
    scale_by_std: bool = True,
    make_env: Callable[[], ShopEnv] | None = None,
    prefix: str = "step",
) -> Experience:
    """Rolls out `group_size` siblings for each task (one group per task, with its context)."""
    if len(task_ids) != len(contexts):
        raise ValueError(f"one context per group: {len(task_ids)} tasks, {len(contexts)} contexts")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")
    make_env = make_env or (lambda: ShopEnv(world))
    specs = [
        EpisodeSpec(int(task), group=g, skill_text=ctx.skill_text, skill_mask=ctx.skill_mask)
        for g, (task, ctx) in enumerate(zip(task_ids, contexts))
        for _ in range(group_size)
    ]
    t0 = time.perf_counter()
    trajs = run_episodes(engine, [make_env() for _ in specs], tokenizer, specs, sampling, agent, episode_prefix=prefix)
    seconds = time.perf_counter() - t0
    rewards = np.asarray([t.reward for t in trajs], np.float32)
    advantages = np.asarray(group_advantages(rewards, group_size, scale_by_std=scale_by_std))
    keep_groups = np.asarray(nonzero_variance_groups(rewards, group_size))
    admitted = np.repeat(keep_groups, group_size)
    return Experience(trajs, advantages, admitted, rollout_metrics(trajs, admitted, seconds))


def rollout_metrics(trajs: Sequence[Trajectory], admitted: np.ndarray, seconds: float) -> dict[str, float]:
    rewards = np.asarray([t.reward for t in trajs], np.float64)
    lengths = np.asarray([t.generated_tokens for t in trajs], np.float64)
    turns = np.asarray([len(t.turns) for t in trajs], np.float64)
    generated = float(lengths.sum())
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/success": float(np.mean([t.success for t in trajs])),
        "rollout/response_tokens_mean": float(lengths.mean()),
        "rollout/response_tokens_max": float(lengths.max()),
        "rollout/tokens_per_turn": float(generated / max(turns.sum(), 1.0)),
        "rollout/turns_mean": float(turns.mean()),
        "rollout/truncation_rate": float(np.mean([t.truncated is not None for t in trajs])),
        "rollout/repairs_per_episode": float(np.mean([t.repairs for t in trajs])),
        "rollout/episodes_generated": float(len(trajs)),
        "rollout/episodes_admitted": float(admitted.sum()),
        "rollout/zero_variance_drop_rate": float(1.0 - admitted.mean()),
        "perf/rollout_seconds": seconds,
        "perf/rollout_generated_tokens_per_s": generated / max(seconds, 1e-9),
    }
