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

from intraskill_jax.agent.episode import AgentConfig, Env, SkillContext, run_groups
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rl.grpo import group_advantages, nonzero_variance_groups
from intraskill_jax.rollout.base import RolloutEngine, SamplingParams


@dataclasses.dataclass
class Experience:
    """A step's episodes. Siblings are contiguous; retry groups (if any) follow the first pass."""

    trajectories: list[Trajectory]  # all generated episodes, siblings contiguous
    advantages: np.ndarray  # [N] float32
    admitted: np.ndarray  # [N] bool: in a group with reward variance
    metrics: dict[str, float]
    retried: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, bool))  # [N] from a retry

    @property
    def train_trajectories(self) -> list[Trajectory]:
        return [t for t, keep in zip(self.trajectories, self.admitted) if keep]

    @property
    def train_advantages(self) -> np.ndarray:
        return self.advantages[self.admitted]


def collect(
    engine: RolloutEngine,
    make_env: Callable[[], Env],
    tokenizer: Any,
    task_ids: Sequence[int],
    contexts: Sequence[SkillContext],
    *,
    group_size: int,
    sampling: SamplingParams,
    agent: AgentConfig,
    scale_by_std: bool = True,
    prefix: str = "step",
    max_concurrent: int | None = None,
    retry: SkillContext | None = None,
) -> Experience:
    """Rolls out `group_size` siblings for each task (one group per task, with its context), each
    in a fresh environment from `make_env` (e.g. `lambda: ShopEnv(world)`).

    With `retry`, every group in which no sibling succeeded is rolled out once more under that
    context (the full skill) as an extra group; the all-wrong original has no reward variance and
    never trains, the retry group trains if it has variance. `skills/retry_*` metrics say what the
    retries recovered.
    """
    if len(task_ids) != len(contexts):
        raise ValueError(f"one context per group: {len(task_ids)} tasks, {len(contexts)} contexts")
    if group_size < 2:
        raise ValueError(f"group_size must be >= 2 for group-relative advantages, got {group_size}")

    def play(tasks: Sequence[int], ctxs: Sequence[SkillContext], first_group: int, tag: str) -> list[Trajectory]:
        return run_groups(engine, make_env, tokenizer, tasks, ctxs, sampling, agent, siblings=group_size,
                          first_group=first_group, prefix=tag, max_concurrent=max_concurrent)

    t0 = time.perf_counter()
    trajs = play(task_ids, contexts, 0, prefix)
    retried = np.zeros(len(trajs), bool)
    outcomes: list[RetryOutcome] = []
    if retry is not None:
        wrong = all_wrong_groups([t.success for t in trajs], group_size)
        if len(wrong):
            again = play([task_ids[g] for g in wrong], [retry] * len(wrong), len(task_ids), f"{prefix}r")
            for j, g in enumerate(wrong):
                sibs = again[j * group_size:(j + 1) * group_size]
                outcomes.append(record_retry(int(g), task_ids[g], contexts[g].skill_mask,
                                             [t.reward for t in sibs], [t.success for t in sibs]))
            trajs += again
            retried = np.concatenate([retried, np.ones(len(again), bool)])
    seconds = time.perf_counter() - t0
    rewards = np.asarray([t.reward for t in trajs], np.float32)
    advantages = np.asarray(group_advantages(rewards, group_size, scale_by_std=scale_by_std))
    keep_groups = np.asarray(nonzero_variance_groups(rewards, group_size))
    admitted = np.repeat(keep_groups, group_size)
    metrics = rollout_metrics(trajs, admitted, seconds)
    if retry is not None:
        metrics.update(retry_metrics(outcomes))
    return Experience(trajs, advantages, admitted, metrics, retried)


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


def all_wrong_groups(successes: Sequence[bool] | np.ndarray, group_size: int) -> np.ndarray:
    """Indices of groups (siblings contiguous) in which no sibling succeeded."""
    s = np.asarray(successes, bool)
    if group_size < 1 or s.size % group_size:
        raise ValueError(f"{s.size} outcomes do not split into groups of {group_size}")
    return np.flatnonzero(~s.reshape(-1, group_size).any(axis=1))


@dataclasses.dataclass(frozen=True)
class RetryOutcome:
    """What one full-skill retry of an all-wrong group produced."""

    group: int
    task_id: int
    original_mask: tuple[int, ...]
    retry_rewards: tuple[float, ...]
    retry_successes: tuple[bool, ...]

    @property
    def recovered(self) -> bool:
        """At least one sibling succeeded with the full skill where none had before."""
        return any(self.retry_successes)


def record_retry(
    group: int,
    task_id: int,
    original_mask: Sequence[int],
    retry_rewards: Sequence[float],
    retry_successes: Sequence[bool],
) -> RetryOutcome:
    if len(retry_rewards) != len(retry_successes):
        raise ValueError(f"{len(retry_rewards)} rewards for {len(retry_successes)} successes")
    return RetryOutcome(
        group,
        int(task_id),
        tuple(int(v) for v in original_mask),
        tuple(float(r) for r in retry_rewards),
        tuple(bool(s) for s in retry_successes),
    )


def retry_metrics(outcomes: Sequence[RetryOutcome]) -> dict[str, float]:
    """`skills/` metrics of one step's retries (zeros when nothing was retried)."""
    n = len(outcomes)
    recovered = sum(o.recovered for o in outcomes)
    episodes = sum(len(o.retry_successes) for o in outcomes)
    successes = sum(sum(o.retry_successes) for o in outcomes)
    rewards = [r for o in outcomes for r in o.retry_rewards]
    return {
        "skills/retry_groups": float(n),
        "skills/retry_recovered_groups": float(recovered),
        "skills/retry_recovery_rate": recovered / n if n else 0.0,
        "skills/retry_success_rate": successes / episodes if episodes else 0.0,
        "skills/retry_reward_mean": float(np.mean(rewards)) if rewards else 0.0,
    }
