"""Supervised warm start on trajectories (oracle demonstrations rendered by the agent loop).

The loss is cross-entropy on the tokens the policy would have sampled (the trajectory's loss mask:
assistant replies only; prompts, observations and padding are context), averaged over every such
token of the optimizer batch, with the same exact micro-batching as the GRPO update. With LoRA
(`SFTConfig.lora`) only the adapters train; the policy it publishes has them merged into its weights.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from intraskill_jax.agent.demos import ACTION_KINDS, action_kind
from intraskill_jax.agent.trajectory import Trajectory, collate
from intraskill_jax.checkpoint import Checkpointer
from intraskill_jax.metrics import MetricsWriter
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models import sharding as sharding_lib
from intraskill_jax.models import token_logprobs
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.progress import Progress, as_progress
from intraskill_jax.rl.train_step import (
    OptimConfig,
    TrainBatch,
    TrainState,
    compacted,
    init_train_state,
    make_optimizer,
    pad_rows,
    scatter_targets,
    sft_step,
    train_batch,
)

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SFTConfig:
    """Attributes:
      optim: optimizer; `optim.micro_batch_size` splits each batch for memory.
      batch_size: trajectories per update (the last batch of an epoch is padded with empty rows,
        so every update has one shape).
      epochs: passes over the trajectories, each in a fresh seeded order.
      seed: shuffling seed.
      length_multiple: padded lengths are `length_multiple * 2**k` (few compiled shapes).
      checkpoint_every: updates between checkpoints when a Checkpointer is given.
      context_loss_weight: weight of every other token's next-token loss (prompts, pages), 0 =
        replies only: a fresh model can learn the shop's language from its pages too (the
        `prompt_loss_weight` / train-on-inputs option of SFT tools).
      lora: train low-rank adapters on the frozen model instead of every weight.
    """

    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(learning_rate=1e-5, warmup_steps=10))
    batch_size: int = 16
    epochs: int = 1
    seed: int = 0
    length_multiple: int = 128
    checkpoint_every: int = 50
    context_loss_weight: float = 0.0
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)

    def __post_init__(self) -> None:
        for name in ("batch_size", "epochs", "length_multiple", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"SFTConfig.{name} must be >= 1, got {getattr(self, name)}")
        if not 0.0 <= self.context_loss_weight <= 1.0:
            raise ValueError(f"SFTConfig.context_loss_weight must be in [0, 1], got {self.context_loss_weight}")

    def num_updates(self, num_trajectories: int) -> int:
        return self.epochs * math.ceil(num_trajectories / self.batch_size)


@dataclasses.dataclass
class SFTResult:
    graphdef: nnx.GraphDef
    state: TrainState
    history: list[dict[str, float]]  # one row of scalar metrics per update


def sft_batches(trajectories: Sequence[Trajectory], config: SFTConfig, *, pad_id: int) -> Iterator[TrainBatch]:
    """Every update's batch, in order: seeded shuffles per epoch, padded to `batch_size` rows."""
    for epoch in range(config.epochs):
        order = np.random.default_rng([config.seed, epoch]).permutation(len(trajectories))
        for start in range(0, len(order), config.batch_size):
            chosen = [trajectories[i] for i in order[start:start + config.batch_size]]
            collated = collate(chosen, pad_id, multiple=config.length_multiple)
            batch = train_batch(collated)
            if config.context_loss_weight:
                context = train_batch({**collated, "loss_mask": collated["attention_mask"]}).loss_mask
                batch = batch._replace(loss_mask=np.where(batch.loss_mask > 0, batch.loss_mask,
                                                          config.context_loss_weight * context))
            else:  # replies only: the vocabulary projection runs on them alone
                batch = compacted(batch)
            yield pad_rows(batch, config.batch_size)


def _check_trajectories(trajectories: Sequence[Trajectory]) -> None:
    if not trajectories:
        raise ValueError("run_sft needs at least one trajectory")
    empty = [t.episode_id for t in trajectories if not any(t.loss_mask)]
    if len(empty) == len(trajectories):
        raise ValueError("No trajectory has a trainable token (loss_mask is all zero); nothing to learn.")
    if empty:
        log.warning("%d of %d trajectories have no trainable token (e.g. %s)", len(empty), len(trajectories), empty[0])


def run_sft(model: nnx.Module, trajectories: Sequence[Trajectory], config: SFTConfig, *, pad_id: int,
            mesh: Mesh | None = None, rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES,
            writer: MetricsWriter | None = None, checkpointer: Checkpointer | None = None,
            progress: bool | Progress = True) -> SFTResult:
    """Fine-tune `model` on `trajectories`; on return `model` holds the trained weights.

    With `config.lora.enabled` the adapters are added to `model` here (in place, seeded by
    `config.seed`) and only they train: on return `model` holds them (`models.lora.merged` folds them
    in; `save_pretrained` does so when it writes it).
    The update donates the parameter buffers, so `model` is only valid again once this returns.
    With a `checkpointer`, a run resumes from its newest checkpoint (same seed: same batches).
    Metrics per update: train/sft_loss (token-mean NLL), train/sft_grad_norm, train/sft_lr,
    train/sft_tokens.
    """
    _check_trajectories(trajectories)
    total = config.num_updates(len(trajectories))
    optimizer = make_optimizer(config.optim)
    if config.lora.enabled:
        lora_lib.apply_lora(model, config.lora, seed=config.seed, mesh=mesh, rules=rules)
    graphdef, state = init_train_state(model, optimizer, mesh=mesh)
    if checkpointer is not None and checkpointer.latest_step() is not None:
        state = checkpointer.restore(state).state
        log.info("SFT resumes at update %d of %d", int(state.step), total)
    step = sft_step(graphdef, optimizer, config.optim, mesh=mesh, rules=rules, length_multiple=config.length_multiple)
    done = int(state.step)
    history: list[dict[str, float]] = []
    bar = as_progress(progress).stage("sft", total, unit="update", initial=done)
    for index, batch in enumerate(sft_batches(trajectories, config, pad_id=pad_id)):
        if index < done:
            continue
        state, metrics = step(state, batch)
        row = {f"train/sft_{k}": float(v) for k, v in jax.device_get(metrics).items()
               if k in ("loss", "grad_norm", "lr", "tokens")}
        history.append(row)
        if writer is not None:
            writer.write(index + 1, row)
        if checkpointer is not None and ((index + 1) % config.checkpoint_every == 0 or index + 1 == total):
            checkpointer.save(index + 1, state, extra={"phase": "sft"})
        bar.update(loss=row["train/sft_loss"])
    bar.close()
    if checkpointer is not None:
        checkpointer.wait_until_finished()
    nnx.update(model, state.params)
    return SFTResult(graphdef=graphdef, state=state, history=history)


@nnx.jit
def _masked_logprobs(model: nnx.Module, batch: TrainBatch) -> jax.Array:
    """[B, L] log-probs of a compact batch's trained targets at their positions (0 elsewhere)."""
    return scatter_targets(token_logprobs(model, batch.input_ids, batch.targets, batch.attention_mask,
                                          target_positions=batch.target_positions), batch)


def reply_logprobs(model: nnx.Module, trajectories: Sequence[Trajectory], *, pad_id: int,
                   batch_size: int = 8) -> list[list[float]]:
    """Per trajectory, the log-likelihood of each reply (each run of sampled tokens) under `model`.

    exp() of one is the chance that sampling at temperature 1 writes exactly that reply, given
    the trajectory's history (teacher forcing).
    """
    out = []
    for start in range(0, len(trajectories), batch_size):
        chunk = trajectories[start:start + batch_size]
        # Compact: the vocabulary projection runs on the replies' positions only.
        batch = pad_rows(train_batch(collate(chunk, pad_id), compact=True), batch_size)
        lp = np.asarray(_masked_logprobs(model, jax.tree.map(np.asarray, batch)))
        for row, traj in zip(lp, chunk):
            # Prediction t scores token t + 1, so tokens [i, j) are scored at [i - 1, j - 1).
            out.append([float(row[max(i - 1, 0):j - 1].sum()) for i, j in traj.reply_spans()])
    return out


def assistant_logprob(model: nnx.Module, trajectories: Sequence[Trajectory], *, pad_id: int,
                      batch_size: int = 8) -> float:
    """Mean log-likelihood per trainable (assistant) token under `model` (an evaluation helper)."""
    total = sum(sum(r) for r in reply_logprobs(model, trajectories, pad_id=pad_id, batch_size=batch_size))
    return total / max(sum(sum(t.loss_mask) for t in trajectories), 1)


def oracle_agreement(model: Any, demos: Sequence[Trajectory], catalog: Any, *, pad_id: int,
                     result_labels: str = "asin") -> dict[str, float]:
    """Per action kind, the mean chance that `model` samples (temperature 1) the oracle's exact
    reply given the oracle's history: whether a warm start learned to act, kind by kind."""
    chances: dict[str, list[float]] = {k: [] for k in ACTION_KINDS}
    for demo, replies in zip(demos, reply_logprobs(model, demos, pad_id=pad_id)):
        for turn, logprob in zip(demo.turns, replies):
            if turn.action is not None:
                chances[action_kind(turn.action, catalog, result_labels)].append(float(np.exp(logprob)))
    return {k: float(np.mean(v)) for k, v in chances.items() if v}
