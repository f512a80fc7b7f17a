"""Trajectory records and their collation into padded, bucketed training arrays."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np


@dataclasses.dataclass
class Turn:
    """One agent turn: what was generated, what it did, what came back."""

    generated_tokens: int
    tool: str | None = None
    arguments: dict[str, Any] | None = None
    action: str | None = None  # the env action it became
    repair: str | None = None  # why the reply was rejected (malformed call, unknown tool, ...)
    observation_chars: int = 0
    observation_tokens: int = 0


@dataclasses.dataclass
class Trajectory:
    """One episode. `token_ids` is the whole conversation; `loss_mask` is 1 on sampled tokens only.

    `logprobs` holds the rollout engine's log-prob for sampled tokens and 0 elsewhere.
    """

    episode_id: str
    task_id: int
    group: int
    skill_mask: tuple[int, ...]
    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    prompt_length: int
    turns: list[Turn] = dataclasses.field(default_factory=list)
    weight_versions: list[int] = dataclasses.field(default_factory=list)
    reward: float = 0.0
    reward_detail: dict[str, float] = dataclasses.field(default_factory=dict)
    env_stats: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: bool = False
    truncated: str | None = None  # 'turns', 'context', 'repairs', 'env_steps' or None

    def append(self, ids: Sequence[int], *, sampled: bool, logprobs: Sequence[float] | None = None) -> None:
        self.token_ids.extend(ids)
        self.loss_mask.extend([1 if sampled else 0] * len(ids))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(ids))

    def reply_spans(self) -> list[tuple[int, int]]:
        """[start, end) of each reply in the conversation: its runs of loss-mask 1, in turn order."""
        sampled = np.asarray(self.loss_mask, bool)
        edges = np.flatnonzero(np.diff(np.concatenate([[False], sampled, [False]]).astype(int)))
        return [(int(i), int(j)) for i, j in zip(edges[::2], edges[1::2])]

    @property
    def repairs(self) -> int:
        return sum(t.repair is not None for t in self.turns)

    @property
    def generated_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def success(self) -> bool:
        return self.reward_detail.get("success", 0.0) == 1.0

    def summary(self) -> dict[str, Any]:
        """A JSON-able record without the token arrays (for logs and the bundle)."""
        d = dataclasses.asdict(self)
        for k in ("token_ids", "loss_mask", "logprobs"):
            d.pop(k)
        d.update(repairs=self.repairs, generated_tokens=self.generated_tokens, length=len(self.token_ids))
        return d


def bucket_length(n: int, multiple: int = 128) -> int:
    """The smallest `multiple * 2**k` or `multiple * 3 * 2**(k-1)` >= n.

    jit sees a handful of shapes, not one per batch, and padding wastes at most a third (pure
    powers of two waste up to half, and the update's time is linear in the padded length).
    """
    size = multiple
    while size < n:
        if size * 3 // 2 >= n and size >= 2 * multiple:
            return size * 3 // 2
        size *= 2
    return size


def collate(trajectories: Sequence[Trajectory], pad_id: int, *, multiple: int = 128) -> dict[str, np.ndarray]:
    """Right-padded arrays [B, L] (L bucketed): tokens, loss_mask, rollout_logprobs, attention_mask."""
    if not trajectories:
        raise ValueError("collate needs at least one trajectory")
    length = bucket_length(max(len(t.token_ids) for t in trajectories), multiple)
    b = len(trajectories)
    tokens = np.full((b, length), pad_id, np.int32)
    mask = np.zeros((b, length), np.float32)
    logprobs = np.zeros((b, length), np.float32)
    attention = np.zeros((b, length), np.int32)
    for i, t in enumerate(trajectories):
        n = len(t.token_ids)
        tokens[i, :n] = t.token_ids
        mask[i, :n] = t.loss_mask
        logprobs[i, :n] = t.logprobs
        attention[i, :n] = 1
    return {"tokens": tokens, "loss_mask": mask, "rollout_logprobs": logprobs, "attention_mask": attention}
