"""The GRPO training loop: contexts -> rollouts -> filter -> update -> weight sync -> log -> checkpoint.

Orchestration only; every numeric piece lives elsewhere (`rl/rollouts.py`, `rl/grpo.py`,
`rl/train_step.py`). A step:

1. take the next `groups_per_step` training tasks from a seeded permutation (the data cursor);
2. ask `contexts_fn` for each group's context (the skill text and mask; empty for plain GRPO);
3. roll out `group_size` siblings per task with the current weights;
4. drop zero-variance groups; with a KL penalty, score the batch under the reference policy; run
   `updates_per_batch` optimizer updates over the whole batch. One update is on-policy: the loss
   takes its own log-probs (stop-gradient) as the "old" ones, so the ratio is exactly 1 and no
   separate scoring pass runs; TIS still weighs them against the rollout's. Several updates score
   the batch once at the rollout weights first, and each later update's ratio moves against
   those and is clipped (PPO's epochs);
5. hand the new weights to the rollout engine (`update_weights`: the model in memory, and an HF
   directory `<workdir>/hf/weight_vNNNNNN/` published only for an engine that asks for one);
   with LoRA (`train.lora`) only the adapters train, and the engine and the export get the
   adapters merged into the weights;
6. write metrics; checkpoint every `checkpoint_every` steps (params, optimizer, step, RNG, cursor).

A killed run resumes from its last checkpoint and replays the same next step.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from intraskill_jax import rundir
from intraskill_jax.agent.episode import AgentConfig, Env, SkillContext
from intraskill_jax.agent.trajectory import collate
from intraskill_jax.checkpoint import Checkpointer
from intraskill_jax.errors import ConfigError
from intraskill_jax.metrics import MetricsWriter
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.models import hf_config
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rl.rollouts import Experience, collect
from intraskill_jax.rl.train_step import (
    LogprobFn,
    OptimConfig,
    ReferenceLogprobs,
    grpo_step,
    init_train_state,
    make_optimizer,
    merge_params,
    pad_rows,
    train_batch,
)
from intraskill_jax.rollout.base import RolloutEngine, SamplingParams, WeightUpdate

log = logging.getLogger(__name__)

ContextsFn = Callable[[int, Sequence[int]], Sequence[SkillContext]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The `train` section of a run config, as the learner reads it.

    Attributes:
      rounds / gate_every: the run is rounds x gate_every GRPO steps (`steps`); the co-evolution
        loop closes a round with the gate every `gate_every` steps.
      groups_per_step / group_size: tasks per step and siblings per task (G).
      scale_by_std: divide advantages by the group std (False: Dr.GRPO).
      updates_per_batch: optimizer updates per step, each over the step's whole batch (GRPO's mu,
        Tunix's num_iterations). Whole batches rather than PPO's shuffled mini-batches: a step's
        batch is small and its row count varies (zero-variance groups are dropped), so cutting
        it would make the number of updates per step vary with it, while `optim.micro_batch_size`
        already bounds the memory of one pass. `optim.warmup_steps` and `optim.total_steps`
        count updates (steps x updates_per_batch); the step's `train/` metrics are the means over
        its updates.
      checkpoint_every: steps between checkpoints (the last step and round ends are always saved).
      seed: data order, masks and sampling (and the adapters' initial A).
      optim / loss: the optimizer and the GRPO loss; `loss.kl_coef > 0` adds the KL penalty to the
        starting policy (with LoRA: the same model with its adapters off; without: a frozen copy
        of the starting weights, one more copy of the parameters in memory).
      lora: train low-rank adapters on the frozen policy instead of every weight.
    """

    rounds: int = 4
    gate_every: int = 20
    groups_per_step: int = 4
    group_size: int = 8
    scale_by_std: bool = True
    updates_per_batch: int = 1
    checkpoint_every: int = 5
    seed: int = 0
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(learning_rate=1e-6))
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)
    lora: LoRAConfig = dataclasses.field(default_factory=LoRAConfig)

    @property
    def steps(self) -> int:
        return self.rounds * self.gate_every

    def __post_init__(self) -> None:
        for name in ("rounds", "gate_every", "groups_per_step", "updates_per_batch", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"train.{name}={getattr(self, name)}: must be >= 1; set train.{name} to 1 or more")
        if self.group_size < 2:
            raise ConfigError(f"train.group_size={self.group_size}: GRPO's advantages compare the siblings of a "
                              "group, so it needs at least 2; set train.group_size to 2 or more")


class TaskCursor:
    """Seeded epochs over the training split; its position is saved with each checkpoint."""

    def __init__(self, task_ids: Sequence[int], seed: int, position: int = 0):
        self.task_ids = np.asarray(task_ids)
        self.seed, self.position = seed, position

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            epoch, k = divmod(self.position, len(self.task_ids))
            order = np.random.default_rng([self.seed, epoch]).permutation(len(self.task_ids))
            out.append(int(self.task_ids[order[k]]))
            self.position += 1
        return out


class Learner:
    def __init__(self, model: Any, tokenizer: Any, engine: RolloutEngine, workdir: rundir.PathLike, *,
                 tasks: Sequence[int], make_env: Callable[[], Env],
                 config: TrainConfig, sampling: SamplingParams, agent: AgentConfig, max_concurrent: int | None = None,
                 contexts_fn: ContextsFn | None = None, mesh: Any = None,
                 on_step: Callable[[int, Experience], dict[str, float]] | None = None,
                 retry_fn: Callable[[int], SkillContext | None] | None = None,
                 checkpoint_extra: Callable[[], dict[str, Any]] | None = None):
        """`tasks` are the training task ids (read in seeded epochs); `make_env()` gives a fresh
        environment for one episode (`lambda: ShopEnv(world)`). `sampling` is the rollouts' (its
        temperature is also the trainer's scoring temperature); `max_concurrent` the episodes in
        flight at once (the engine's batch capacity; None: all of a step).

        Hooks: `contexts_fn(step, tasks)` gives each group's context; `retry_fn(step)` the
        context all-wrong groups are retried with (None: no retry); `on_step(step, exp)` sees the
        step's experience before the update and returns extra metrics; `checkpoint_extra()` adds
        JSON fields to each checkpoint."""
        self.tokenizer, self.engine, self.make_env = tokenizer, engine, make_env
        self.workdir = rundir.run_path(workdir)
        self.config, self.sampling, self.agent, self.max_concurrent = config, sampling, agent, max_concurrent
        self.contexts_fn = contexts_fn or (lambda step, tasks: [SkillContext() for _ in tasks])
        self.on_step = on_step
        self.retry_fn = retry_fn or (lambda step: None)
        self.checkpoint_extra = checkpoint_extra or dict
        self.mesh = mesh
        self.hf_config = hf_config(model.config)
        optim = config.optim
        tx = make_optimizer(optim)
        if config.lora.enabled:
            lora_lib.apply_lora(model, config.lora, seed=config.seed, mesh=mesh)
        self.graphdef, self.state = init_train_state(model, tx, mesh=mesh)
        self.update = grpo_step(self.graphdef, tx, optim, config.loss, temperature=sampling.temperature, mesh=mesh)
        # Only several updates per batch need the log-probs at the rollout weights (see `_update`).
        self.old_logprobs = None if config.updates_per_batch == 1 else LogprobFn(
            self.graphdef, temperature=sampling.temperature, micro_batch_size=optim.micro_batch_size, mesh=mesh)
        # Taken before any update (they donate the parameters) and before a resume restores
        # trained weights: the reference is the policy the run started from.
        self.ref_logprobs = None if config.loss.kl_coef == 0 else ReferenceLogprobs(
            model, self.state.params, temperature=sampling.temperature, micro_batch_size=optim.micro_batch_size,
            mesh=mesh)
        # With micro-batches every update pads its rows to the most a step can admit (each group
        # and its retry), so the update and the log-prob pass compile once per length; the
        # padding micro-batches are skipped inside the step.
        most = config.groups_per_step * config.group_size * (2 if retry_fn is not None else 1)
        self.pad_rows_to = most if optim.micro_batch_size else 1
        self.cursor = TaskCursor(tasks, config.seed)
        self.checkpoints = Checkpointer(rundir.checkpoints_dir(self.workdir))
        self.step = 0
        self._resume()
        # Rows past the restored step came from work the kill threw away; it will be redone.
        self.metrics = MetricsWriter(self.workdir, rewind_to=self.step)

    # -- state ---------------------------------------------------------------------------------

    def _resume(self) -> None:
        if self.checkpoints.latest_step() is None:
            return
        restored = self.checkpoints.restore(self.state)
        self.state, self.step = restored.state, restored.step
        self.cursor.position = int(restored.extra["cursor"])
        log.info("resumed from %s at step %d", self.checkpoints.step_path(restored.step), restored.step)
        self._push_weights()

    def model(self) -> Any:
        """The policy at the current parameters (with its adapters, when it trains LoRA)."""
        return merge_params(self.graphdef, self.state)

    def _push_weights(self) -> None:
        version = self.step
        # The engine gets the adapters merged into the weights (`models.lora.merged`), not the
        # adapted model, whose every decode step and prefill would run the adapters' low-rank
        # products: a merge pays once a push is followed by some 190 decode steps (CPU, embedded
        # sampler, `python -m intraskill_jax.bench.lora --size 30m`, 33M parameters, rank 8 on the
        # 7 projections: 69 ms per merge against 14.57 instead of 14.20 ms per decode step of 16
        # rows; at the quickstart size, 9 ms against no measurable decode difference and 5% more
        # per prefill). A step's rollouts run far more (the quickstart: 6 turns of up to 48 tokens
        # per wave of episodes). The price is one more copy of the adapted weights while sampling
        # (the learner keeps the base). The export reads the update's own (cached) model, so the
        # parameters are merged once per push.
        weights = WeightUpdate(version=version, load_model=lambda: lora_lib.merged(self.model()),
                               publish=lambda: self._export(weights.model(), version))
        self.engine.update_weights(weights)

    def _export(self, model: Any, version: int) -> epath.Path:
        return rundir.publish_policy(rundir.hf_weights_dir(self.workdir, version), model, self.tokenizer,
                                     hf_config=self.hf_config)

    # -- the loop ------------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        self.checkpoints.save(self.step, self.state, extra={"cursor": self.cursor.position, **self.checkpoint_extra()})

    def train_step(self) -> dict[str, float]:
        cfg = self.config
        tasks = self.cursor.take(cfg.groups_per_step)
        contexts = self.contexts_fn(self.step, tasks)
        self.engine.reseed(cfg.seed, self.step)  # sampling depends on (seed, step) only: resumes replay
        exp = collect(self.engine, self.make_env, self.tokenizer, tasks, contexts, group_size=cfg.group_size,
                      sampling=self.sampling, agent=self.agent, scale_by_std=cfg.scale_by_std,
                      prefix=f"s{self.step}", max_concurrent=self.max_concurrent, retry=self.retry_fn(self.step))
        metrics = dict(exp.metrics)
        if self.on_step is not None:
            metrics.update(self.on_step(self.step, exp))
        rundir.reached("step_rollouts")
        train = exp.train_trajectories
        if train:
            metrics.update(self._update(exp))
        self.step += 1
        metrics["train/updated"] = float(bool(train))
        self._push_weights()
        self.metrics.write(self.step, metrics)
        if self.step % cfg.checkpoint_every == 0 or self.step == cfg.steps:
            self.save_checkpoint()
        return metrics

    def _update(self, exp: Experience) -> dict[str, float]:
        collated = collate(exp.train_trajectories, self.tokenizer.pad_token_id)
        # Taken before the first update: the rollout weights are the ones every pass's ratio is
        # against. With one pass the loss uses its own log-probs (None: the same ratio of 1, one
        # forward pass fewer).
        old = None
        if self.old_logprobs is not None:
            old = np.asarray(self.old_logprobs(self.state.params, collated, pad_to=self.pad_rows_to))
        ref = None
        if self.ref_logprobs is not None:
            ref = np.asarray(self.ref_logprobs(self.state.params, collated, pad_to=self.pad_rows_to))
        batch = pad_rows(train_batch(collated, advantages=exp.train_advantages, old_logprobs=old, ref_logprobs=ref,
                                     compact=True),
                         self.pad_rows_to)
        tokens = float(np.asarray(collated["loss_mask"]).sum())
        t0 = time.perf_counter()
        passes = []
        for _ in range(self.config.updates_per_batch):
            self.state, m = self.update(self.state, batch)
            passes.append(m)
        passes = jax.device_get(passes)
        seconds = time.perf_counter() - t0
        out = {f"train/{k}": float(np.mean([m[k] for m in passes])) for k in passes[0]}
        out["perf/update_seconds"] = seconds
        scored = float(np.asarray(collated["attention_mask"]).sum()) * len(passes)
        out["perf/update_tokens_per_s"] = scored / max(seconds, 1e-9)
        out["train/trained_tokens"] = tokens
        return out

    def close(self) -> None:
        self.checkpoints.close()
        self.metrics.close()
