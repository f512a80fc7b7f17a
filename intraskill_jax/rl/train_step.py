"""The optimizer and the jitted, sharded update steps (GRPO and supervised) over a model's mesh.

Array alignment. Collated trajectories are *token-aligned*: position t of `loss_mask` or
`rollout_logprobs` describes token t. The model scores token t+1 from tokens[:t+1], so the steps
work on a *prediction-aligned* `TrainBatch` (position t carries target tokens[t+1] and the
token-aligned values of t+1); `train_batch` makes one from `collate`'s output. Every [B, L] array
a caller passes in or gets back (old / reference / rollout log-probs) is token-aligned.

Gradient accumulation is exact: the batch is cut into micro-batches, each micro-batch loss is
built with the denominators of the *whole* batch (token and sequence counts), so their sum is the
global loss and the summed gradients are its gradient; metrics are carried as (sum, weight) pairs
and divided once at the end. The micro-batch loop is a `lax.scan`, so one program serves any
number of micro-batches of a given size. A batch of rows of mixed lengths (multi-turn episodes) is
instead ordered by length and each micro-batch run at its own bucketed length (`length_groups`):
the same sums, at the rows' cost rather than the longest row's.

Sharding: parameters keep the layout they were created with (`models.sharding.create_sharded`),
optimizer moments follow their parameter, batches are split over ('data', 'fsdp') along rows.
The compiled step pins its output state to the input layout so donation reuses the buffers.

LoRA: a model holding adapters (`models.lora.apply_lora`) trains them alone. The update
differentiates the `nnx.LoRAParam` variables only and the optimizer state holds their moments only;
the base weights ride along in `TrainState.params` as frozen operands (no weight gradients are
formed for them, so a step skips the weight-gradient matmuls of every frozen layer) and come out
unchanged. Checkpoints keep the whole `TrainState`, so a resumed run restores the base it trained on.

Use:

    tx = make_optimizer(optim)
    graphdef, state = init_train_state(model, tx, mesh=mesh)   # model laid out on mesh
    step = grpo_step(graphdef, tx, optim, LossConfig(), temperature=rollout_temperature, mesh=mesh)
    batch = train_batch(collate(trajs, pad_id), advantages=adv)   # + old_logprobs / ref_logprobs
    state, metrics = step(state, batch)                          # `state` is donated
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import flax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from intraskill_jax.agent.trajectory import bucket_length
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models import sharding as sharding_lib
from intraskill_jax.models import token_logprobs
from intraskill_jax.rl.grpo import LossConfig, Weighted, policy_loss

Schedule = Literal["constant", "cosine"]


# -- optimizer ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW with global-norm clipping, a warmup and a schedule, and the micro-batch size.

    Attributes:
      learning_rate: peak learning rate.
      warmup_steps: updates of linear warmup; update k (from 0) uses lr * (k + 1) / warmup_steps,
        so the first update already moves the weights.
      schedule: 'constant' after warmup, or 'cosine' decay to min_lr_ratio * lr at total_steps.
      total_steps: optimizer updates of the run (needed by 'cosine').
      min_lr_ratio: final lr of the cosine as a fraction of the peak.
      weight_decay: decoupled AdamW decay, applied to matrices only (not norms or biases).
      b1, b2, eps: Adam moments and epsilon.
      grad_clip: clip the global gradient norm to this (None: no clipping).
      micro_batch_size: rows per forward/backward pass; the batch is padded with empty rows to a
        multiple of it (None: the whole batch in one pass).
    """

    learning_rate: float = 1e-6
    warmup_steps: int = 0
    schedule: Schedule = "constant"
    total_steps: int | None = None
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip: float | None = 1.0
    micro_batch_size: int | None = None

    def __post_init__(self) -> None:
        if not self.learning_rate > 0:
            raise ValueError(f"OptimConfig.learning_rate must be > 0, got {self.learning_rate}")
        if self.warmup_steps < 0:
            raise ValueError(f"OptimConfig.warmup_steps must be >= 0, got {self.warmup_steps}")
        if self.schedule not in ("constant", "cosine"):
            raise ValueError(f"OptimConfig.schedule must be 'constant' or 'cosine', got {self.schedule!r}")
        if self.schedule == "cosine" and (self.total_steps is None or self.total_steps <= self.warmup_steps):
            raise ValueError(
                f"schedule='cosine' needs total_steps > warmup_steps ({self.warmup_steps}); got "
                f"total_steps={self.total_steps}. Set total_steps to the run's number of updates.")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ValueError(f"OptimConfig.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.weight_decay < 0:
            raise ValueError(f"OptimConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not (0 <= self.b1 < 1 and 0 <= self.b2 < 1 and self.eps > 0):
            raise ValueError(f"need 0 <= b1, b2 < 1 and eps > 0; got {self.b1}, {self.b2}, {self.eps}")
        if self.grad_clip is not None and not self.grad_clip > 0:
            raise ValueError(f"OptimConfig.grad_clip must be > 0 (or None to disable), got {self.grad_clip}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise ValueError(f"OptimConfig.micro_batch_size must be >= 1 (or None), got {self.micro_batch_size}")


def learning_rate_schedule(config: OptimConfig) -> optax.Schedule:
    """lr as a function of the number of updates already applied."""
    lr = config.learning_rate
    if config.schedule == "cosine":
        assert config.total_steps is not None  # checked by OptimConfig
        main = optax.cosine_decay_schedule(lr, config.total_steps - config.warmup_steps, alpha=config.min_lr_ratio)
    else:
        main = optax.constant_schedule(lr)
    if config.warmup_steps <= 1:
        return main
    warmup = optax.linear_schedule(lr / config.warmup_steps, lr, config.warmup_steps - 1)
    return optax.join_schedules([warmup, main], [config.warmup_steps])


def _decay_mask(params: Any) -> Any:
    return jax.tree.map(lambda p: jnp.ndim(p) >= 2, params)


def make_optimizer(config: OptimConfig) -> optax.GradientTransformation:
    """Global-norm clipping, then AdamW on the schedule."""
    adamw = optax.adamw(learning_rate_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                        weight_decay=config.weight_decay, mask=_decay_mask)
    if config.grad_clip is None:
        return adamw
    return optax.chain(optax.clip_by_global_norm(config.grad_clip), adamw)


# -- state -------------------------------------------------------------------------------------


@flax.struct.dataclass
class TrainState:
    """What an update changes. `step` counts the updates applied so far (int32 scalar)."""

    step: jax.Array
    params: nnx.State  # the model's nnx.Param variables, adapters (nnx.LoRAParam) included
    opt_state: optax.OptState  # over `trainable_params(params)` only


def trainable_params(params: nnx.State) -> nnx.State:
    """What an update trains: a model's adapters when it has any (`models.lora`), else all of it."""
    return nnx.filter_state(params, lora_lib.trainable(params))


def _replicated(mesh: Mesh | None) -> NamedSharding | None:
    return None if mesh is None else NamedSharding(mesh, PartitionSpec())


def _state_shardings(params_sharding: Any, optimizer: optax.GradientTransformation,
                     abstract_opt_state: Any, mesh: Mesh) -> TrainState:
    """Moments live where their parameter lives; counters are replicated."""
    replicated = _replicated(mesh)
    opt = optax.tree_map_params(optimizer, lambda _, s: s, abstract_opt_state, trainable_params(params_sharding),
                                transform_non_params=lambda _: replicated)
    return TrainState(step=replicated, params=params_sharding, opt_state=opt)


def _params_only(state: nnx.State) -> nnx.State:
    params, rest = nnx.split_state(state, nnx.Param, ...)
    if jax.tree.leaves(rest):
        kinds = sorted({type(v).__name__ for v in jax.tree.leaves(rest, is_leaf=lambda x: isinstance(x, nnx.Variable))})
        raise ValueError(f"The model holds non-Param state ({', '.join(kinds)}); the train step only carries "
                         "nnx.Param variables, so that state would be lost.")
    return params


def _split_params(model: nnx.Module) -> tuple[nnx.GraphDef, nnx.State]:
    graphdef, state = nnx.split(model)
    return graphdef, _params_only(state)


def init_train_state(model: nnx.Module, optimizer: optax.GradientTransformation, *,
                     mesh: Mesh | None = None) -> tuple[nnx.GraphDef, TrainState]:
    """Split `model` into (graphdef, TrainState at step 0).

    On a mesh the model must already be laid out on it (`create_sharded`, `shard_model` or
    `load_pretrained(mesh=...)`); the optimizer state is created in the matching layout.
    """
    graphdef, params = _split_params(model)
    if mesh is None:
        opt_state = jax.jit(optimizer.init)(trainable_params(params))
        state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state)
        # Commit every array to where it is: the step's outputs are committed, and jit keys its
        # cache on commitment, so an uncommitted first state would cost a second compile.
        return graphdef, jax.device_put(state, jax.tree.map(lambda x: x.sharding, state))
    params_sharding = jax.tree.map(lambda x: x.sharding, params)
    trained = trainable_params(params)
    shardings = _state_shardings(params_sharding, optimizer, jax.eval_shape(optimizer.init, trained), mesh)
    opt_state = jax.jit(optimizer.init, out_shardings=shardings.opt_state)(trained)
    step = jax.device_put(jnp.zeros((), jnp.int32), shardings.step)
    return graphdef, TrainState(step=step, params=params, opt_state=opt_state)


def abstract_train_state(model_factory: Callable[[], nnx.Module], optimizer: optax.GradientTransformation,
                         *, mesh: Mesh | None = None,
                         rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES
                         ) -> tuple[nnx.GraphDef, TrainState]:
    """(graphdef, TrainState of ShapeDtypeStructs carrying shardings) without allocating:
    the target to restore a checkpoint onto."""
    graphdef, abstract = sharding_lib.abstract_model(model_factory, mesh, rules)
    params = _params_only(abstract)
    abstract_opt = jax.eval_shape(optimizer.init, trainable_params(params))
    step = jax.ShapeDtypeStruct((), jnp.int32)
    if mesh is None:
        return graphdef, TrainState(step=step, params=params, opt_state=abstract_opt)
    shardings = _state_shardings(jax.tree.map(lambda a: a.sharding, params), optimizer, abstract_opt, mesh)
    with_sharding = functools.partial(jax.tree.map, lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s))
    return graphdef, TrainState(step=jax.ShapeDtypeStruct((), jnp.int32, sharding=shardings.step), params=params,
                                opt_state=with_sharding(abstract_opt, shardings.opt_state))


def merge_params(graphdef: nnx.GraphDef, state: TrainState) -> nnx.Module:
    """The model at a state's parameters (shares their buffers)."""
    return nnx.merge(graphdef, state.params)


# -- batches -----------------------------------------------------------------------------------


class TrainBatch(NamedTuple):
    """Prediction-aligned training rows: position t predicts targets[b, t] from input_ids[b, :t+1].

    input_ids, attention_mask: [B, L] int; advantages: [B] (GRPO only). The per-target arrays,
    targets (int), loss_mask (float, 1: trained target) and rollout/old/ref_logprobs (log-probs of
    the targets), are [B, L], or, when `target_positions` [B, K] is given, [B, K]: the k-th entry of
    row b is the target of position target_positions[b, k] (a compact batch, `train_batch(...,
    compact=True)`: only the trained targets, whose logits alone are computed).
    """

    input_ids: Any
    targets: Any
    attention_mask: Any
    loss_mask: Any
    advantages: Any = None
    rollout_logprobs: Any = None
    old_logprobs: Any = None
    ref_logprobs: Any = None
    target_positions: Any = None

    @property
    def num_rows(self) -> int:
        return int(np.shape(self.input_ids)[0])


def _next(x: Any) -> np.ndarray:
    """Token-aligned [B, L] -> prediction-aligned: drop column 0, pad one zero column at the end."""
    x = np.asarray(x)
    return np.concatenate([x[:, 1:], np.zeros_like(x[:, :1])], axis=1)


# A compact batch keeps K = COMPACT_MIN * 2**j targets per row: few compiled shapes.
COMPACT_MIN = 64


def train_batch(collated: Mapping[str, Any], *, advantages: Any = None, old_logprobs: Any = None,
                ref_logprobs: Any = None, use_rollout_logprobs: bool = True, compact: bool = False) -> TrainBatch:
    """A `TrainBatch` from `collate(...)` output plus token-aligned extras (host-side, NumPy).

    `compact`: keep only the targets the loss mask trains (K per row: the most any row has, rounded
    up to `COMPACT_MIN` times a power of two; a row's spare entries zero-masked), so the update projects K positions to
    the vocabulary instead of L: a policy's sampled replies are a small part of its episodes
    (SmolLM2 on the shop: ~15% of the tokens, while the projection to its 49,152-token vocabulary
    is a third of a LoRA update's FLOPs). Every sum and count is the dense batch's.
    """
    tokens = np.asarray(collated["tokens"])
    if tokens.ndim != 2:
        raise ValueError(f"collated tokens must be [B, L], got shape {tokens.shape}")
    for name, value in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if value is not None and np.shape(value) != tokens.shape:
            raise ValueError(f"{name} has shape {np.shape(value)}; expected token-aligned {tokens.shape}")
    if advantages is not None and np.shape(advantages) != tokens.shape[:1]:
        raise ValueError(f"advantages has shape {np.shape(advantages)}; expected ({tokens.shape[0]},)")
    rollout = collated.get("rollout_logprobs") if use_rollout_logprobs else None
    batch = TrainBatch(
        input_ids=tokens,
        targets=_next(tokens),
        attention_mask=np.asarray(collated["attention_mask"]),
        loss_mask=_next(np.asarray(collated["loss_mask"], np.float32)),
        advantages=None if advantages is None else np.asarray(advantages, np.float32),
        rollout_logprobs=None if rollout is None else _next(np.asarray(rollout, np.float32)),
        old_logprobs=None if old_logprobs is None else _next(np.asarray(old_logprobs, np.float32)),
        ref_logprobs=None if ref_logprobs is None else _next(np.asarray(ref_logprobs, np.float32)),
    )
    return compacted(batch) if compact else batch


_PER_TARGET = ("targets", "loss_mask", "rollout_logprobs", "old_logprobs", "ref_logprobs")


def compacted(batch: TrainBatch) -> TrainBatch:
    """`batch` with only its trained targets (see `train_batch(compact=True)`)."""
    if batch.target_positions is not None:
        return batch
    trained = np.asarray(batch.loss_mask) > 0
    k = COMPACT_MIN
    while k < trained.sum(axis=1).max(initial=0):
        k *= 2
    # Each row's trained positions in order, then position 0 for the rest (masked below).
    order = np.argsort(~trained, axis=1, kind="stable")[:, :k]
    keep = np.take_along_axis(trained, order, axis=1)
    positions = np.where(keep, order, 0).astype(np.int32)

    def take(x: Any) -> Any:
        if x is None:
            return x
        picked = np.take_along_axis(np.asarray(x), positions, axis=1)
        return np.where(keep, picked, 0).astype(np.asarray(x).dtype)

    return batch._replace(**{name: take(getattr(batch, name)) for name in _PER_TARGET}, target_positions=positions)


def scatter_targets(values: jax.Array, batch: TrainBatch) -> jax.Array:
    """[B, K] values of a compact batch's kept targets back at their positions: [B, L], 0 at every
    position that is not a trained target."""
    rows = jnp.arange(values.shape[0])[:, None]
    return jnp.zeros(batch.input_ids.shape, jnp.float32).at[rows, batch.target_positions].add(
        jnp.where(batch.loss_mask > 0, values, 0.0))


def pad_rows(batch: TrainBatch, multiple: int) -> TrainBatch:
    """Appends empty rows (loss mask 0) up to a multiple of `multiple` rows.

    Padding rows attend to their own (pad) tokens so no row is fully masked, which could put
    NaNs into the forward pass; they add nothing to any sum or count.
    """
    b = batch.num_rows
    extra = (-b) % multiple
    if extra == 0:
        return batch

    def pad(name: str, x: Any) -> Any:
        if x is None:
            return None
        x = np.asarray(x)
        fill = np.ones_like(x[:1]) if name == "attention_mask" else np.zeros_like(x[:1])
        return np.concatenate([x, np.repeat(fill, extra, axis=0)], axis=0)

    return TrainBatch(*(pad(name, x) for name, x in zip(TrainBatch._fields, batch)))


class Totals(NamedTuple):
    """Denominators of the whole optimizer batch."""

    tokens: jax.Array
    sequences: jax.Array


def _totals(batch: TrainBatch) -> Totals:
    per_row = batch.loss_mask.astype(jnp.float32).sum(axis=1)
    return Totals(tokens=per_row.sum(), sequences=(per_row > 0).sum().astype(jnp.float32))


def row_lengths(batch: TrainBatch) -> np.ndarray:
    """Each row's length: one past its last attended position (rows are right-padded)."""
    attended = np.asarray(batch.attention_mask) > 0
    width = attended.shape[1]
    return np.where(attended.any(axis=1), width - np.argmax(attended[:, ::-1], axis=1), 0)


def length_groups(batch: TrainBatch, micro: int, multiple: int) -> list[TrainBatch] | None:
    """A mixed-length batch's micro-batches, each cut to its own length; None where none is shorter.

    Rows that train nothing (loss mask all zero: padding rows) are dropped; the rest are ordered
    longest first and cut into micro-batches of `micro` rows (the last one padded with empty rows),
    each truncated to `bucket_length` of its longest row (a few compiled lengths). Truncating a
    right-padded row after its last token changes none of its log-probs (attention is causal), and
    every sum the update takes is over rows, so the update is the padded batch's, at the cost of the
    rows' own lengths instead of the longest one's: a GRPO batch of multi-turn episodes spans 2x in
    length (SmolLM2 on the shop: 1,100-2,400 tokens, collated to 3,072).
    """
    width = np.shape(batch.input_ids)[1]
    trained = np.asarray(batch.loss_mask).any(axis=1)
    lengths = row_lengths(batch)
    rows = np.flatnonzero(trained)
    rows = rows[np.argsort(-lengths[rows], kind="stable")]
    chunks = [rows[i:i + micro] for i in range(0, len(rows), micro)]
    cut = [min(width, bucket_length(int(lengths[c].max()), multiple)) for c in chunks]
    if len(chunks) < 2 or all(c == width for c in cut):
        return None
    dense = batch.target_positions is None

    def take(name: str, x: Any, chunk: np.ndarray, length: int) -> Any:
        if x is None:
            return None
        x = np.asarray(x)[chunk]
        return x[:, :length] if name in ("input_ids", "attention_mask") or (dense and name in _PER_TARGET) else x

    return [pad_rows(TrainBatch(*(take(name, x, chunk, length) for name, x in zip(TrainBatch._fields, batch))), micro)
            for chunk, length in zip(chunks, cut)]


def strided_order(rows: int, count: int) -> np.ndarray:
    """The row order under which `_micro_batches`' strided split yields contiguous blocks.

    Placing row k at position (k % m) * count + k // m (m = rows / count rows per micro-batch)
    makes micro-batch i hold rows [i * m, (i + 1) * m) of the original order, so real rows that
    precede the padding fill whole micro-batches and the padding ones can be skipped.
    Returns `order` with reordered = original[order].
    """
    m = rows // count
    position = (np.arange(rows) % m) * count + np.arange(rows) // m
    return np.argsort(position)


def _micro_batches(batch: TrainBatch, count: int) -> TrainBatch:
    """[B, ...] leaves -> [count, B / count, ...]; micro-batch i takes rows i, i + count, ...

    Strided rather than contiguous so every micro-batch keeps the rows' split over the data
    axes (a contiguous block would sit on a subset of devices).
    """
    def split(x: jax.Array) -> jax.Array:
        rows = x.shape[0] // count
        return x.reshape(rows, count, *x.shape[1:]).swapaxes(0, 1)

    return jax.tree.map(split, batch)


def row_sharding(shape: tuple[int, ...], mesh: Mesh,
                 rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES) -> NamedSharding:
    """Where a batch leaf of `shape` ([B, ...]) lives: rows split over the mesh's batch axes as far
    as B divides, the other dimensions whole."""
    axes = ("batch",) + (None,) * (len(shape) - 1)
    return NamedSharding(mesh, sharding_lib.logical_to_spec(axes, shape, mesh, rules))


def _to_device(batch: TrainBatch, mesh: Mesh | None, rules: sharding_lib.LogicalRules) -> TrainBatch:
    if mesh is None:
        return jax.tree.map(jnp.asarray, batch)
    return jax.tree.map(lambda x: jax.device_put(np.asarray(x), row_sharding(np.shape(x), mesh, rules)), batch)


# -- the update --------------------------------------------------------------------------------

# loss_fn(model, micro_batch, totals) -> (loss, metrics). The loss must use `totals` as its
# denominators so that micro-batch losses sum to the batch loss.
MicroLoss = Callable[[nnx.Module, TrainBatch, Totals], tuple[jax.Array, dict[str, Weighted]]]


class UpdateStep:
    """One optimizer update per call: micro-batched forward/backward, then AdamW.

    `step(state, batch) -> (new_state, metrics)`; metrics are scalar device arrays: each loss
    metric's exact batch mean, plus loss, grad_norm (before clipping), lr (used by this update),
    tokens and sequences (the batch's trained targets and non-empty rows).
    """

    def __init__(self, graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, config: OptimConfig,
                 loss_fn: MicroLoss, *, mesh: Mesh | None = None,
                 rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES, donate: bool = True,
                 length_multiple: int = 128):
        self.graphdef = graphdef
        self.optimizer = optimizer
        self.length_multiple = length_multiple
        self.config = config
        self.mesh = mesh
        self.rules = rules
        self._schedule = learning_rate_schedule(config)
        self._loss_fn = loss_fn
        self._donate = donate
        self._compiled: dict[Any, Callable[..., Any]] = {}

    # The update is three traced pieces: a zero carry (loss, gradient and metric sums), the
    # accumulation of micro-batches into it, and the optimizer's step from it. `_update` fuses them
    # into one program (a batch whose micro-batches all have its length); a batch of rows of mixed
    # lengths runs each micro-batch at its own length instead (`length_groups`).

    def _split(self, params: nnx.State) -> tuple[nnx.State, nnx.State]:
        # Only the trainable part is differentiated: the frozen rest (a LoRA model's base weights)
        # is an operand without a gradient.
        return nnx.split_state(params, lora_lib.trainable(params), ...)

    def _micro_loss(self, trained: nnx.State, frozen: nnx.State, mb: TrainBatch, totals: Totals):
        # jax.grad hands its non-differentiated arguments in as they are; remat'd layers cannot
        # merge Variables made outside the traced function (flax's TraceContextError), so the
        # frozen ones are made afresh here.
        frozen = jax.tree.map(lambda x: x, frozen)
        return self._loss_fn(nnx.merge(self.graphdef, trained, frozen), mb, totals)

    def _zero_carry(self, params: nnx.State, mb: TrainBatch, totals: Totals, params_sharding: Any) -> Any:
        trained, frozen = self._split(params)
        metric_shapes = jax.eval_shape(self._micro_loss, trained, frozen, mb, totals)[1]

        def zeros_f32(x: Any) -> jax.Array:
            return jnp.zeros(jnp.shape(x), jnp.float32)

        grads0 = jax.tree.map(zeros_f32, trained)
        if params_sharding is not None:
            grads0 = jax.lax.with_sharding_constraint(grads0, trainable_params(params_sharding))
        return jnp.zeros((), jnp.float32), grads0, jax.tree.map(zeros_f32, metric_shapes)

    def _accumulate(self, carry: Any, params: nnx.State, micro: TrainBatch, totals: Totals) -> Any:
        """`carry` plus the sums of the micro-batches `micro` ([count, rows, ...] leaves)."""
        trained, frozen = self._split(params)
        grad_fn = jax.value_and_grad(self._micro_loss, has_aux=True)

        def accumulate(carry, mb):
            loss_sum, grad_sum, metric_sum = carry
            (loss, metrics), grads = grad_fn(trained, frozen, mb, totals)
            grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
            metric_sum = jax.tree.map(lambda a, m: a + m.astype(jnp.float32), metric_sum, metrics)
            return loss_sum + loss, grad_sum, metric_sum

        def body(carry, mb):
            # A micro-batch of padding rows adds zero to every sum: skip its forward and backward,
            # so a batch padded to a fixed row count (one compiled shape) costs only its real rows.
            return jax.lax.cond(jnp.any(mb.loss_mask > 0), accumulate, lambda c, _: c, carry, mb), None

        return jax.lax.scan(body, carry, micro)[0]

    def _apply(self, state: TrainState, carry: Any, totals: Totals) -> tuple[TrainState, dict[str, jax.Array]]:
        loss, grads, metrics = carry
        trained, frozen = self._split(state.params)
        grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
        # Back to the parameters' dtype so the optimizer state keeps the dtype it was built with.
        grads = jax.tree.map(lambda g, p: g.astype(p.dtype), grads, trained)
        updates, opt_state = self.optimizer.update(grads, state.opt_state, trained)
        params = nnx.merge_state(optax.apply_updates(trained, updates), frozen)
        out = {name: m.mean for name, m in metrics.items() if name != "tokens"}
        out.update(loss=loss, grad_norm=grad_norm, lr=jnp.asarray(self._schedule(state.step), jnp.float32),
                   tokens=totals.tokens, sequences=totals.sequences)
        return TrainState(step=state.step + 1, params=params, opt_state=opt_state), out

    def _update(self, state: TrainState, batch: TrainBatch, *, num_micro: int,
                params_sharding: Any) -> tuple[TrainState, dict[str, jax.Array]]:
        totals = _totals(batch)
        micro = _micro_batches(batch, num_micro)
        carry = self._zero_carry(state.params, jax.tree.map(lambda x: x[0], micro), totals, params_sharding)
        return self._apply(state, self._accumulate(carry, state.params, micro, totals), totals)

    def _shardings(self, state: TrainState) -> tuple[Any, Any, Any]:
        # The new state keeps the input layout: the next call then hits the same executable (a
        # drifted layout would recompile once more) and donation can reuse every buffer.
        state_sharding = jax.tree.map(lambda x: x.sharding, state)
        metrics_sharding = state_sharding.step if self.mesh is None else _replicated(self.mesh)
        params_sharding = None if self.mesh is None else state_sharding.params
        return state_sharding, metrics_sharding, params_sharding

    def _compile(self, state: TrainState, num_micro: int) -> Callable[..., Any]:
        state_sharding, metrics_sharding, params_sharding = self._shardings(state)
        fn = functools.partial(self._update, num_micro=num_micro, params_sharding=params_sharding)
        return jax.jit(fn, out_shardings=(state_sharding, metrics_sharding),
                       donate_argnums=(0,) if self._donate else ())

    def _grouped_programs(self, state: TrainState) -> tuple[Callable[..., Any], ...]:
        """(zero carry, accumulate one micro-batch, optimizer step): the update of a mixed-length
        batch, one micro-batch per call at its own length (compiled once per length)."""
        if "grouped" not in self._compiled:
            state_sharding, metrics_sharding, params_sharding = self._shardings(state)
            zero = jax.jit(functools.partial(self._zero_carry, params_sharding=params_sharding))
            accumulate = jax.jit(lambda carry, params, mb, totals: self._accumulate(
                carry, params, jax.tree.map(lambda x: x[None], mb), totals), donate_argnums=(0,))
            # The new state reuses the old one's buffers; the gradient sums have none to fill.
            apply = jax.jit(self._apply, out_shardings=(state_sharding, metrics_sharding),
                            donate_argnums=(0,) if self._donate else ())
            self._compiled["grouped"] = (zero, accumulate, apply)
        return self._compiled["grouped"]

    def __call__(self, state: TrainState, batch: TrainBatch) -> tuple[TrainState, dict[str, jax.Array]]:
        micro = self.config.micro_batch_size or batch.num_rows
        groups = length_groups(batch, micro, self.length_multiple)
        if groups is not None:
            totals = jax.tree.map(jnp.asarray, _totals(batch))  # the whole batch's, on the host
            zero, accumulate, apply = self._grouped_programs(state)
            mbs = [_to_device(mb, self.mesh, self.rules) for mb in groups]
            with _mesh_context(self.mesh, self.rules):
                carry = zero(state.params, mbs[0], totals)
                for mb in mbs:
                    carry = accumulate(carry, state.params, mb, totals)
                return apply(state, carry, totals)
        batch = pad_rows(batch, micro)
        num_micro = batch.num_rows // micro
        order = strided_order(batch.num_rows, num_micro)
        batch = _to_device(jax.tree.map(lambda x: np.asarray(x)[order], batch), self.mesh, self.rules)
        key = (num_micro, tuple(x is None for x in batch))
        if key not in self._compiled:
            self._compiled[key] = self._compile(state, num_micro)
        with _mesh_context(self.mesh, self.rules):
            return self._compiled[key](state, batch)

    def trace(self, state: TrainState, batch: TrainBatch) -> jax.stages.Traced:
        """The program `__call__` runs on a batch of this shape, traced for ahead-of-time compilation.

        Leaves may be `jax.ShapeDtypeStruct`s carrying their shardings (`intraskill_jax.compile_check`
        compiles for TPU topologies this way); the rows must already be padded to a multiple of the
        micro-batch size, as `__call__` pads them.
        """
        num_micro = _padded_micro_batches(batch.num_rows, self.config.micro_batch_size)
        with _mesh_context(self.mesh, self.rules):
            return self._compile(state, num_micro).trace(state, batch)


def _padded_micro_batches(rows: int, micro_batch_size: int | None) -> int:
    micro = micro_batch_size or rows
    if rows % micro:
        raise ValueError(f"trace needs the rows ({rows}) padded to a multiple of micro_batch_size ({micro})")
    return rows // micro


def _mesh_context(mesh: Mesh | None, rules: sharding_lib.LogicalRules):
    """The model's `constrain` calls read the mesh and rules from context at trace time."""
    if mesh is None:
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    stack.enter_context(jax.set_mesh(mesh))
    stack.enter_context(nnx.logical_axis_rules(rules))
    return stack


# -- losses ------------------------------------------------------------------------------------


def grpo_micro_loss(model: nnx.Module, mb: TrainBatch, totals: Totals, *, loss_config: LossConfig,
                    temperature: float) -> tuple[jax.Array, dict[str, Weighted]]:
    """GRPO loss of one micro-batch against the whole batch's denominators."""
    if mb.advantages is None:
        raise ValueError("the GRPO step needs advantages in the TrainBatch")
    logprobs, entropy = token_logprobs(model, mb.input_ids, mb.targets, mb.attention_mask,
                                       temperature=temperature, return_entropy=True,
                                       target_positions=mb.target_positions)
    out = policy_loss(logprobs, mb.old_logprobs, mb.advantages, mb.loss_mask, loss_config,
                      rollout_logprobs=mb.rollout_logprobs, ref_logprobs=mb.ref_logprobs,
                      entropy=jax.lax.stop_gradient(entropy), num_tokens=totals.tokens,
                      num_sequences=totals.sequences)
    return out.loss, out.metrics


def sft_micro_loss(model: nnx.Module, mb: TrainBatch, totals: Totals) -> tuple[jax.Array, dict[str, Weighted]]:
    """Token-mean negative log-likelihood of the trained targets (global token count)."""
    logprobs = token_logprobs(model, mb.input_ids, mb.targets, mb.attention_mask,
                              target_positions=mb.target_positions)
    mask = mb.loss_mask.astype(jnp.float32)
    nll = -(logprobs * mask).sum()
    return nll / jnp.maximum(totals.tokens, 1.0), {"nll": Weighted(nll, mask.sum())}


def grpo_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, config: OptimConfig,
              loss_config: LossConfig, *, temperature: float = 1.0, mesh: Mesh | None = None,
              rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES, donate: bool = True,
              length_multiple: int = 128) -> UpdateStep:
    """The GRPO update. Log-probs are scored at the rollout `temperature`, as the sampler did.
    `length_multiple`: the grid of a mixed-length batch's micro-batch lengths (`length_groups`)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 (the rollout's sampling temperature), got {temperature}")
    loss_fn = functools.partial(grpo_micro_loss, loss_config=loss_config, temperature=temperature)
    return UpdateStep(graphdef, optimizer, config, loss_fn, mesh=mesh, rules=rules, donate=donate,
                      length_multiple=length_multiple)


def sft_step(graphdef: nnx.GraphDef, optimizer: optax.GradientTransformation, config: OptimConfig, *,
             mesh: Mesh | None = None, rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES,
             donate: bool = True, length_multiple: int = 128) -> UpdateStep:
    """The supervised update (cross-entropy on loss-mask targets)."""
    return UpdateStep(graphdef, optimizer, config, sft_micro_loss, mesh=mesh, rules=rules, donate=donate,
                      length_multiple=length_multiple)


# -- trainer-side log-probs --------------------------------------------------------------------


class LogprobFn:
    """Trainer-side log-probs of collated tokens at given parameters, without gradients.

    `fn(params, collated) -> [B, L]` token-aligned: the "old" log-probs for several updates per
    batch and for the rollout/trainer mismatch (TIS), or the reference policy's log-probs for a KL
    penalty. Only the tokens the loss mask trains are scored (a compact batch, `compacted`); every
    other entry, column 0 and padding included, is 0.
    """

    def __init__(self, graphdef: nnx.GraphDef, *, temperature: float = 1.0, micro_batch_size: int | None = None,
                 mesh: Mesh | None = None, rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES):
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.graphdef = graphdef
        self.temperature = temperature
        self.micro_batch_size = micro_batch_size
        self.mesh = mesh
        self.rules = rules
        self._compiled: dict[int, Callable[..., Any]] = {}

    def _logprobs(self, params: nnx.State, batch: TrainBatch, *, num_micro: int) -> jax.Array:
        def one(mb: TrainBatch) -> jax.Array:
            def score(params: nnx.State, mb: TrainBatch) -> jax.Array:
                # The parameters enter the cond as operands and the model is merged in here: remat'd
                # layers (policy.remat='full') cannot run on parameters closed over from outside
                # (flax's TraceContextError).
                model = nnx.merge(self.graphdef, params)
                return token_logprobs(model, mb.input_ids, mb.targets, mb.attention_mask, temperature=self.temperature,
                                      target_positions=mb.target_positions)

            def skip(params: nnx.State, mb: TrainBatch) -> jax.Array:
                return jnp.zeros(mb.targets.shape, jnp.float32)

            # Micro-batches of padding rows only (no trained token) are not scored.
            return jax.lax.cond(jnp.any(mb.loss_mask > 0), score, skip, params, mb)

        lp = jax.lax.map(one, _micro_batches(batch, num_micro))  # [n, rows, K or L]
        lp = lp.swapaxes(0, 1).reshape(batch.input_ids.shape[0], -1)
        if batch.target_positions is not None:  # back from the kept targets to their positions
            lp = scatter_targets(lp, batch)
        # Prediction t scores token t + 1: shift right to token alignment.
        return jnp.concatenate([jnp.zeros_like(lp[:, :1]), lp[:, :-1]], axis=1)

    def __call__(self, params: nnx.State, collated: Mapping[str, Any], *, pad_to: int = 1) -> jax.Array:
        """`pad_to`: pad the rows to a multiple of this first (e.g. a fixed count: one shape)."""
        full = train_batch(collated, use_rollout_logprobs=False, compact=True)
        rows = full.num_rows
        micro = self.micro_batch_size or rows
        batch = pad_rows(pad_rows(full, pad_to), micro)
        num_micro = batch.num_rows // micro
        order = strided_order(batch.num_rows, num_micro)
        batch = _to_device(jax.tree.map(lambda x: np.asarray(x)[order], batch), self.mesh, self.rules)
        with _mesh_context(self.mesh, self.rules):
            lp = self._jitted(num_micro)(params, batch)
        return lp[np.argsort(order)[:rows]]

    def _jitted(self, num_micro: int) -> Callable[..., jax.Array]:
        if num_micro not in self._compiled:
            self._compiled[num_micro] = jax.jit(functools.partial(self._logprobs, num_micro=num_micro))
        return self._compiled[num_micro]

    def trace(self, params: nnx.State, batch: TrainBatch) -> jax.stages.Traced:
        """The program `__call__` runs on a prediction-aligned batch of this shape (rows a multiple
        of micro_batch_size; leaves may be sharded `jax.ShapeDtypeStruct`s), traced for
        ahead-of-time compilation."""
        num_micro = _padded_micro_batches(batch.num_rows, self.micro_batch_size)
        with _mesh_context(self.mesh, self.rules):
            return self._jitted(num_micro).trace(params, batch)



class ReferenceLogprobs:
    """The reference policy's log-probs for the KL penalty: the policy the run started from.

    `ref(params, collated) -> [B, L]` token-aligned, as `LogprobFn` scores them (the rollout
    temperature, micro-batches, padding micro-batches skipped). With LoRA the reference is the same
    model with its adapters off (`models.lora.without_adapters`), read from the current parameters'
    frozen base: no second copy of the weights. Without LoRA every weight moves, so the starting
    weights are kept as a frozen copy (one more copy of the parameters, laid out like them).

    Args:
      model: the policy at its starting weights (with adapters, if it trains them).
      params: those starting parameters (`TrainState.params` at step 0, before any update donates
        them).
    """

    def __init__(self, model: nnx.Module, params: nnx.State, *, temperature: float = 1.0,
                 micro_batch_size: int | None = None, mesh: Mesh | None = None,
                 rules: sharding_lib.LogicalRules = sharding_lib.DEFAULT_RULES):
        self.lora = lora_lib.has_adapters(params)
        graphdef = nnx.graphdef(lora_lib.without_adapters(model) if self.lora else model)
        self._frozen = None if self.lora else jax.tree.map(jnp.copy, params)
        self._logprobs = LogprobFn(graphdef, temperature=temperature, micro_batch_size=micro_batch_size,
                                   mesh=mesh, rules=rules)

    def params(self, params: nnx.State) -> nnx.State:
        """The reference's parameters, given the policy's current ones."""
        return lora_lib.base_params(params) if self._frozen is None else self._frozen

    def __call__(self, params: nnx.State, collated: Mapping[str, Any], *, pad_to: int = 1) -> jax.Array:
        return self._logprobs(self.params(params), collated, pad_to=pad_to)
