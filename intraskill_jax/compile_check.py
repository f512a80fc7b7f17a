"""`intraskill compile-check`: will a config's jitted programs fit the chips of a TPU slice?

    intraskill compile-check --config=configs/qwen3_5_4b.py --topology=v5p-8 [--topology=v6e-64 ...]
        [--mfu=0.4] [--json] [--search_micro_batch] [--programs=train_step,logprobs]
        [--config.train.optim.micro_batch_size=2 --config.mesh.tensor=2 ...]

Runs on any machine with libtpu installed (`pip install 'jax[tpu]'`), no TPU needed: each program
a run of the config jits is compiled ahead of time for the named slice's chips
(`jax.experimental.topologies`), from abstract inputs that carry the shardings the trainer gives
them, so no parameter is ever materialised. The programs, at the largest shapes the config allows:

  train_step  the GRPO update (`rl.train_step.grpo_step`): micro-batch scan, remat and gradient
              accumulation as configured, over the most rows a step holds (groups x G, doubled
              for retries) at the longest context (agent.max_context_tokens, bucketed)
  logprobs    the trainer's log-prob pass (`LogprobFn`) over the same batch (run at the rollout
              weights with train.updates_per_batch > 1, and for the reference with a KL penalty)
  prefill     the embedded sampler's prefill of its largest bucket into a cache of
              rollout.sampler.max_length slots for rollout.sampler.max_batch rows
  decode      its decode loop (bucketed rollout.sampling.max_new_tokens steps) over that cache

Per chip and program: argument bytes (parameters, optimizer state, cache, the rest), temporaries,
outputs, the total XLA's buffer assignment needs against the chip's HBM, and the FLOPs of one call
with the time they take at the stated FLOP utilisation. The sampler programs count towards the
verdict only when the config runs them (rollout.engine=jax); then the sampler's cache also stays
allocated while the trainer's programs run. Exit status 1, naming the knobs, when a program the
config runs does not fit.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx
from jax.extend import core as jex_core
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from ml_collections import config_flags

from sim import flagparse

from intraskill_jax import runconfig
from intraskill_jax.agent.trajectory import bucket_length
from intraskill_jax.errors import CheckpointError
from intraskill_jax.models import ModelConfig, causal_lm_class, config_from_file, init_cache
from intraskill_jax.models import acquire
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models import sharding as sharding_lib
from intraskill_jax.rl.train_step import (
    LogprobFn,
    TrainBatch,
    abstract_train_state,
    grpo_step,
    make_optimizer,
    row_sharding,
)
from intraskill_jax.rollout import jax_sampler

log = logging.getLogger(__name__)

GiB = 1 << 30


class CompileCheckError(ValueError):
    """A topology, config or environment the check cannot compile for: names it and the fix."""


# -- chips and topologies --------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class Chip:
    """Attributes:
      hbm_bytes: the HBM XLA:TPU lets one chip's programs use: the "available HBM" its compiler
        reports when a program exceeds it (libtpu 0.0.42). The Cloud TPU pages give the nominal
        capacity: 95 GB (v5p), 32 GB (v6e), 16 GB (v5e).
      peak_flops: peak bf16 FLOP/s per chip (Cloud TPU pages: 459, 918 and 197 TFLOP/s).
    """

    kind: str
    hbm_bytes: int
    peak_flops: float


CHIPS = {
    "v5p": Chip(kind="v5p", hbm_bytes=int(95.74 * GiB), peak_flops=459e12),
    "v6e": Chip(kind="v6e", hbm_bytes=int(31.25 * GiB), peak_flops=918e12),
    "v5e": Chip(kind="v5e", hbm_bytes=int(15.75 * GiB), peak_flops=197e12),
}

# Cloud accelerator types -> chip grids. v5p-N counts TensorCores (two per chip, one JAX device
# per chip), so v5p-8 is 4 chips; v6e-N and v5e-N count chips.
_V5P = {8: "2x2x1", 16: "2x2x2", 32: "2x2x4", 64: "2x4x4", 128: "4x4x4", 256: "4x4x8", 512: "4x8x8"}
_LITE = {4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
TOPOLOGIES = {**{f"v5p-{n}": ("v5p", s) for n, s in _V5P.items()},
              **{f"{kind}-{n}": (kind, s) for kind in ("v6e", "v5e") for n, s in _LITE.items()}}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topology:
    name: str  # as the user wrote it: 'v5p-8', or 'v5p:2x2x1'
    chip: Chip
    shape: str  # chip grid, '2x2x1'

    @property
    def chips(self) -> int:
        return math.prod(int(n) for n in self.shape.split("x"))

    def devices(self) -> list[Any]:
        """Compile-only devices of this slice (needs libtpu, not a TPU)."""
        from jax.experimental import topologies

        try:
            import libtpu  # noqa: F401  (the topology comes from libtpu's compiler)
        except ImportError:
            raise CompileCheckError(f"compile-check needs libtpu to describe {self.name}: pip install "
                                    f"'jax[tpu]=={jax.__version__}' (no TPU is needed)") from None
        # libtpu takes a machine-wide lock (/tmp/libtpu_lockfile) meant for owning chips, so a second
        # process would fail to load it; compiling for a described topology owns none.
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
        return list(topologies.get_topology_desc(f"{self.chip.kind}:{self.shape}", "tpu").devices)


def parse_topology(name: str) -> Topology:
    """'v5p-64' (a Cloud accelerator type) or 'v5p:2x4x4' (chip kind and grid)."""
    if name in TOPOLOGIES:
        kind, shape = TOPOLOGIES[name]
    else:
        kind, _, shape = name.partition(":")
        if kind not in CHIPS or not shape or not all(p.isdigit() for p in shape.split("x")):
            raise CompileCheckError(f"unknown topology {name!r}: use one of {', '.join(TOPOLOGIES)} or "
                                    f"KIND:GRID with KIND in {sorted(CHIPS)} (e.g. v5p:2x2x2)")
    return Topology(name=name, chip=CHIPS[kind], shape=shape)


# -- the programs ------------------------------------------------------------------------------------


def model_config(config: runconfig.RunConfig) -> tuple[ModelConfig, str]:
    """The policy's architecture and where it came from: policy.path's config.json, the published
    architecture its directory name names when that path does not exist (a placeholder in the
    study's configs), or the fresh tiny model when policy.path is empty. Numerics follow `policy`; 'auto'
    dtype is bfloat16, what a TPU run uses."""
    p = config.policy
    overrides = {"dtype": "bfloat16" if p.dtype == "auto" else p.dtype, **p.model_overrides(),
                 "transpose_decode_weights": False}  # a CPU option: accelerator programs read the weights as stored
    overrides["param_dtype"] = overrides["dtype"]
    if not p.path:
        init = {**p.init, "vocab_size": p.tokenizer_vocab_size}
        return ModelConfig.tiny_qwen3_5(**{**init, **overrides}), "the fresh tiny policy (policy.init)"
    try:  # a checkpoint name, .gguf file or hub id: its cached HF directory, fetched once
        path, unavailable = acquire.resolve_checkpoint(p.path, config_only=True), ""
    except CheckpointError as e:
        path, unavailable = runconfig.resolve_repo_path(p.path), f" ({e})"
    if (path / "config.json").is_file():
        return config_from_file(path, **overrides), f"{path}/config.json"
    # The study's configs name a checkpoint directory that is not on this machine; its name says
    # which published architecture it holds.
    published = {"Qwen3.5-4B": ModelConfig.qwen3_5_4b, "Qwen3-4B": ModelConfig.qwen3_4b}
    if path.name not in published:
        raise CompileCheckError(f"policy.path {path} has no config.json{unavailable} and its name is none of the "
                                f"published architectures known here ({sorted(published)}): point policy.path at a "
                                "checkpoint directory")
    build = published[path.name]
    log.info("policy.path %s does not exist%s: checking the %s architecture (ModelConfig.%s)", path, unavailable,
             path.name, build.__name__)
    return build(**overrides), f"ModelConfig.{build.__name__} (policy.path {path} does not exist)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Program:
    """A traced program and how to read its arguments.

    Attributes:
      group: names the argument group of a flattened argument leaf from its pytree path.
      while_trips: iterations of its `while_loop`s (the decode loop; 1 where there is none).
      runs: whether the config runs it on the trainer's chips.
      knobs: the config fields that shrink it, with their values.
    """

    name: str
    traced: jax.stages.Traced
    args: tuple[Any, ...]
    group: Callable[[tuple[Any, ...]], str]
    while_trips: int
    runs: bool
    knobs: tuple[str, ...]


def batch_rows(config: runconfig.RunConfig) -> int:
    """The rows the learner pads every update to: each group and its retry (`Learner.pad_rows_to`),
    then to a multiple of the micro-batch."""
    t = config.train
    rows = t.groups_per_step * t.group_size * 2
    micro = t.optim.micro_batch_size or rows
    return -(-rows // micro) * micro


def _abstract(shape: tuple[int, ...], dtype: Any, sharding: NamedSharding) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _train_batch(rows: int, length: int, mesh: Mesh, *, grpo: bool, kl: bool = False,
                 old: bool = False) -> TrainBatch:
    """What `Learner._update` gives the update (grpo; with the reference's log-probs when `kl`, the
    rollout weights' when `old`: several updates per batch) and the log-prob pass, as abstract leaves."""
    def leaf(dtype: Any, shape: tuple[int, ...] = (rows, length)) -> jax.ShapeDtypeStruct:
        return _abstract(shape, dtype, row_sharding(shape, mesh))

    batch = TrainBatch(input_ids=leaf(jnp.int32), targets=leaf(jnp.int32), attention_mask=leaf(jnp.int32),
                       loss_mask=leaf(jnp.float32))
    if not grpo:
        return batch
    return batch._replace(advantages=leaf(jnp.float32, (rows,)), rollout_logprobs=leaf(jnp.float32),
                          old_logprobs=leaf(jnp.float32) if old else None,
                          ref_logprobs=leaf(jnp.float32) if kl else None)


def _top_name(path: tuple[Any, ...], names: Sequence[str]) -> str:
    return names[path[0].idx]


def _state_group(path: tuple[Any, ...]) -> str:
    if path[0].idx == 1:
        return "batch"
    return {"params": "params", "opt_state": "optimizer", "step": "optimizer"}[path[1].name]


def trainer_programs(config: runconfig.RunConfig, mc: ModelConfig, mesh: Mesh, names: Sequence[str]) -> list[Program]:
    """The GRPO update and the log-prob pass, traced as `Learner` builds them (with its adapters
    when it trains LoRA: the optimizer state is then the adapters' moments only)."""
    lora = config.train.lora

    def factory() -> nnx.Module:
        model = causal_lm_class(mc)(mc, rngs=nnx.Rngs(0))
        return lora_lib.apply_lora(model, lora) if lora.enabled else model

    optim, rows = config.train.optim, batch_rows(config)
    length = bucket_length(config.agent.max_context_tokens)
    tx = make_optimizer(optim)
    graphdef, state = abstract_train_state(factory, tx, mesh=mesh)
    temperature = config.rollout.sampling.temperature
    m, shards = config.mesh, batch_shards(mesh)
    knobs = (f"train.optim.micro_batch_size (now {optim.micro_batch_size}; a multiple of data x fsdp = {shards}, "
             "or each chip computes whole micro-batches)",
             f"policy.remat (now {config.policy.remat!r}; 'full' keeps only layer inputs)",
             f"policy.attention_block_size (now {config.policy.attention_block_size}; 0 materialises "
             "[T, T] attention scores per head)",
             f"mesh.fsdp / mesh.tensor (now data={m.data} fsdp={m.fsdp} tensor={m.tensor})",
             f"agent.max_context_tokens (now {config.agent.max_context_tokens})")
    out = []
    if "train_step" in names:
        step = grpo_step(graphdef, tx, optim, config.train.loss, temperature=temperature, mesh=mesh)
        args = (state, _train_batch(rows, length, mesh, grpo=True, kl=config.train.loss.kl_coef > 0,
                                    old=config.train.updates_per_batch > 1))
        out.append(Program(name="train_step", traced=step.trace(*args), args=args, group=_state_group,
                           while_trips=1, runs=True, knobs=knobs))
    if "logprobs" in names:
        fn = LogprobFn(graphdef, temperature=temperature, micro_batch_size=optim.micro_batch_size, mesh=mesh)
        args = (state.params, _train_batch(rows, length, mesh, grpo=False))
        out.append(Program(name="logprobs", traced=fn.trace(*args), args=args,
                           group=lambda path: _top_name(path, ("params", "batch")), while_trips=1, runs=True,
                           knobs=knobs[:1] + knobs[2:]))  # no gradients: remat does not matter
    return out


Compiled = tuple[jax.stages.Compiled | None, str | None, float]  # (program, compiler's refusal, seconds)


def sampler_programs(config: runconfig.RunConfig, mc: ModelConfig, mesh: Mesh,
                     names: Sequence[str]) -> tuple[list[Program], Compiled | None]:
    """The embedded sampler's prefill and decode, traced as `JaxSampler.generate` calls them. Its
    cache starts unsharded (`init_cache`), which jit replicates over the parameters' devices; decode
    sees the layout prefill returns it in, so prefill is compiled here (and returned) first."""
    s, sampling = config.rollout.sampler, config.rollout.sampling
    factory = lambda: causal_lm_class(mc)(mc, rngs=nnx.Rngs(0))  # noqa: E731
    graphdef, params = sharding_lib.abstract_model(factory, mesh)
    replicated = NamedSharding(mesh, PartitionSpec())

    def place(tree: Any, shardings: Any) -> Any:
        return jax.tree.map(lambda a, sh: _abstract(a.shape, a.dtype, sh), tree, shardings)

    cache = jax.eval_shape(lambda: init_cache(mc, s.max_batch, s.max_length))
    cache = place(cache, jax.tree.map(lambda _: replicated, cache))
    width = s.prefill_buckets[-1]
    runs = config.rollout.engine == "jax"
    knobs = (f"rollout.sampler.max_batch (now {s.max_batch})", f"rollout.sampler.max_length (now {s.max_length})",
             f"mesh.fsdp / mesh.tensor (now data={config.mesh.data} fsdp={config.mesh.fsdp} tensor={config.mesh.tensor})")
    groups = ("params", "cache", "inputs")
    args = (params, cache, _abstract((s.max_batch, width), jnp.int32, replicated),
            _abstract((s.max_batch, width), jnp.bool_, replicated))
    prefill = Program(name="prefill", traced=jax_sampler.prefill.trace(graphdef, *args), args=args,
                      group=lambda path: groups[min(path[0].idx, 2)], while_trips=1, runs=runs,
                      knobs=knobs[:1] + (f"rollout.sampler.prefill_buckets (now {s.prefill_buckets})",) + knobs[1:])
    out, compiled = [prefill] if "prefill" in names else [], None
    if "decode" in names:
        compiled = _compile(prefill)
        if compiled[0] is not None:
            cache = place(cache, compiled[0].output_shardings[1])
        key = jax.eval_shape(lambda: jax.random.key(0))
        steps = s.decode_steps(sampling.max_new_tokens)
        scalar = lambda dtype: _abstract((), dtype, replicated)  # noqa: E731
        args = (params, cache, _abstract((s.max_batch, mc.vocab_size), jnp.float32, replicated),
                _abstract(key.shape, key.dtype, replicated), _abstract((s.max_batch,), jnp.bool_, replicated),
                scalar(jnp.float32), scalar(jnp.float32),
                _abstract((max(1, len(mc.eos_token_ids)),), jnp.int32, replicated), scalar(jnp.int32))
        if s.draft_tokens:  # each row's history to draft from, as `generate` passes it
            args += (_abstract((s.max_batch, s.max_length + steps), jnp.int32, replicated),
                     _abstract((s.max_batch,), jnp.int32, replicated))
        traced = jax_sampler.decode.trace(graphdef, *args, steps=steps, top_k=sampling.top_k,
                                          halvings=s.decode_halvings, drafts=s.draft_tokens)
        out.append(Program(name="decode", traced=traced, args=args, group=lambda path: groups[min(path[0].idx, 2)],
                           while_trips=steps, runs=runs,
                           knobs=knobs + (f"rollout.sampling.max_new_tokens (now {sampling.max_new_tokens})",)))
    return out, compiled


# -- measuring -----------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramReport:
    """One program on one chip. Bytes are per chip; None where the compiler refused the program.

    Attributes:
      arguments: argument bytes by group (params, optimizer, batch, cache, inputs): each leaf's
        shard under the sharding the compiled program takes it in.
      argument_bytes .. alias_bytes: XLA's buffer assignment (`memory_analysis`); aliased bytes are
        donated inputs reused for outputs.
      peak_bytes: the most bytes XLA's buffer assignment has live at once (arguments, outputs and
        temporaries; less than their sum when temporaries die early): what its compiler checks
        against the chip's HBM.
      resident_bytes: other buffers allocated while it runs: the sampler's cache, which stays
        allocated through the update when the config samples in process (rollout.engine=jax).
      total_bytes: what the chip needs: peak_bytes + resident_bytes.
      flops: FLOPs of one call on one chip (every loop run to its trip count).
      seconds: flops / (peak FLOP/s x the utilisation asked for).
      error: the compiler's message when it refused the program (out of HBM).
    """

    name: str
    runs: bool
    fits: bool
    arguments: dict[str, int]
    argument_bytes: int | None
    temp_bytes: int | None
    output_bytes: int | None
    alias_bytes: int | None
    peak_bytes: int | None
    resident_bytes: int
    total_bytes: int | None
    flops: float | None
    seconds: float | None
    compile_seconds: float
    error: str | None
    knobs: tuple[str, ...]


def _compile(program: Program) -> Compiled:
    start = time.perf_counter()
    try:
        compiled = program.traced.lower().compile()
    except jax.errors.JaxRuntimeError as e:
        if "RESOURCE_EXHAUSTED" not in str(e):
            raise
        return None, str(e).strip().splitlines()[0], time.perf_counter() - start
    return compiled, None, time.perf_counter() - start


def argument_bytes_by_group(program: Program, compiled: jax.stages.Compiled | None) -> dict[str, int]:
    """Per-chip bytes of the arguments, by group, under the shardings the compiled program takes
    (those the arguments were given, where the compiler refused the program)."""
    leaves = jax.tree_util.tree_flatten_with_path(program.args)[0]
    shardings = ([leaf.sharding for _, leaf in leaves] if compiled is None
                 else jax.tree.leaves(compiled.input_shardings[0]))
    if len(shardings) != len(leaves):
        raise RuntimeError(f"{program.name}: {len(leaves)} argument leaves but {len(shardings)} input shardings")
    out: dict[str, int] = {}
    for (path, leaf), sharding in zip(leaves, shardings):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            continue  # a few bytes, and key dtypes have no plain itemsize
        shard = math.prod(sharding.shard_shape(leaf.shape)) * jnp.dtype(leaf.dtype).itemsize
        out[program.group(path)] = out.get(program.group(path), 0) + shard
    return out


def _dot_flops(eqn: Any) -> float:
    lhs, out = eqn.invars[0].aval, eqn.outvars[0].aval
    (contracting, _), _ = eqn.params["dimension_numbers"]
    return 2.0 * math.prod(out.shape) * math.prod(lhs.shape[d] for d in contracting)


def matmul_flops(jaxpr: Any, while_trips: int = 1) -> tuple[float, float]:
    """Matmul FLOPs of a jaxpr: (each loop body counted once, as XLA's cost analysis counts them;
    every loop run to its trip count). Scans run their length, while loops `while_trips` times,
    a cond its costliest branch."""
    once = full = 0.0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            once, full = once + _dot_flops(eqn), full + _dot_flops(eqn)
            continue
        subs = [matmul_flops(j, while_trips) for j in jex_core.jaxprs_in_params(eqn.params)]
        if not subs:
            continue
        if name == "cond":
            o, f = max(subs, key=lambda s: s[1])
        elif name == "while":
            o, f = matmul_flops(eqn.params["body_jaxpr"].jaxpr, while_trips)
            f *= while_trips
        else:
            o, f = sum(s[0] for s in subs), sum(s[1] for s in subs)
            if name == "scan":
                f *= eqn.params["length"]
        once, full = once + o, full + f
    return once, full


def measure(program: Program, chip: Chip, mfu: float, *, resident_bytes: int = 0,
            compiled: Compiled | None = None) -> ProgramReport:
    """Compiles `program` (unless `compiled` is given) and reads its memory and FLOPs per chip.

    XLA's cost analysis counts each loop body once; the per-chip FLOPs scale it by how much running
    every loop to its trip count multiplies the program's matmul FLOPs (from its jaxpr).
    """
    compiled, error, seconds = _compile(program) if compiled is None else compiled
    fields: dict[str, Any] = dict(name=program.name, runs=program.runs, resident_bytes=resident_bytes,
                                  compile_seconds=seconds, knobs=program.knobs)
    if compiled is None:
        return ProgramReport(**fields, fits=False, arguments=argument_bytes_by_group(program, None),
                             argument_bytes=None, temp_bytes=None,
                             output_bytes=None, alias_bytes=None, peak_bytes=None, total_bytes=None, flops=None,
                             seconds=None, error=error)
    mem = compiled.memory_analysis()
    peak = mem.peak_memory_in_bytes
    total = peak + resident_bytes
    once, full = matmul_flops(program.traced.jaxpr.jaxpr, program.while_trips)
    flops = float(compiled.cost_analysis()["flops"]) * (full / once if once else 1.0)
    return ProgramReport(**fields, fits=total <= chip.hbm_bytes, arguments=argument_bytes_by_group(program, compiled),
                         argument_bytes=mem.argument_size_in_bytes, temp_bytes=mem.temp_size_in_bytes,
                         output_bytes=mem.output_size_in_bytes, alias_bytes=mem.alias_size_in_bytes,
                         peak_bytes=peak, total_bytes=total, flops=flops, seconds=flops / (chip.peak_flops * mfu), error=None)


PROGRAMS = ("prefill", "decode", "train_step", "logprobs")


@dataclasses.dataclass(frozen=True, kw_only=True)
class TopologyReport:
    topology: str
    chip: str
    chips: int
    mesh: dict[str, int]
    hbm_bytes: int
    peak_flops: float
    mfu: float
    architecture: str
    programs: list[ProgramReport]
    largest_micro_batch: int | None = None  # searched only on request; 0: not even 1 fits

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.programs if p.runs)


def check(config: runconfig.RunConfig, topology: Topology, *, mfu: float = 0.4,
          programs: Sequence[str] = PROGRAMS, resident_bytes: int | None = None) -> TopologyReport:
    """Compiles the config's programs for `topology` and measures each per chip. The trainer's
    programs count the sampler's cache as resident (rollout.engine=jax) as decode takes it, or
    `resident_bytes` when given."""
    unknown = sorted(set(programs) - set(PROGRAMS))
    if unknown:
        raise CompileCheckError(f"unknown program(s) {unknown}; known: {', '.join(PROGRAMS)}")
    if not 0 < mfu <= 1:
        raise CompileCheckError(f"--mfu must be in (0, 1], got {mfu}")
    mc, architecture = model_config(config)
    devices = topology.devices()
    try:
        mesh = sharding_lib.make_mesh(config.mesh, devices)
    except ValueError as e:
        raise CompileCheckError(f"mesh: {e} ({topology.name} has {len(devices)} chips)") from None
    reports = []
    resident = resident_bytes or 0
    if {"prefill", "decode"} & set(programs):
        sampler, prefill_compiled = sampler_programs(config, mc, mesh, programs)
        for program in sampler:
            reports.append(measure(program, topology.chip, mfu,
                                   compiled=prefill_compiled if program.name == "prefill" else None))
            if program.name == "decode" and program.runs and reports[-1].arguments and resident_bytes is None:
                resident = reports[-1].arguments["cache"]  # the layout the sampler holds it in
    for program in trainer_programs(config, mc, mesh, programs):
        reports.append(measure(program, topology.chip, mfu, resident_bytes=resident))
    return TopologyReport(topology=topology.name, chip=topology.chip.kind, chips=len(devices),
                          mesh=dict(mesh.shape), hbm_bytes=topology.chip.hbm_bytes,
                          peak_flops=topology.chip.peak_flops, mfu=mfu, architecture=architecture,
                          programs=reports)


def batch_shards(mesh: Mesh) -> int:
    """Chips a batch's rows split over when their count allows it: the mesh axes of the 'batch' rule."""
    (axes,) = sharding_lib.logical_to_spec(("batch",), (mesh.size,), mesh)
    axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


def largest_micro_batch(config: runconfig.RunConfig, topology: Topology, *, resident_bytes: int = 0) -> int:
    """The largest micro-batch whose update and log-prob pass fit beside `resident_bytes`, among
    the batch shards (data x fsdp) doubled up to the step's rows: a smaller micro-batch leaves its
    rows replicated, which costs each chip more memory, not less. Bisection, since memory grows
    with the micro-batch; 0 when none fits."""
    shards = batch_shards(sharding_lib.make_mesh(config.mesh, topology.devices()))
    rows = config.train.groups_per_step * config.train.group_size * 2
    candidates = [shards << k for k in range(rows.bit_length()) if shards << k <= rows] or [rows]
    lo, hi = -1, len(candidates)  # candidates[lo] fits, candidates[hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        trial = runconfig.with_overrides(config, {"train.optim.micro_batch_size": candidates[mid]})
        fits = all(check(trial, topology, programs=(name,), resident_bytes=resident_bytes).fits
                   for name in ("train_step", "logprobs"))  # all() stops at the update when it does not fit
        log.info("%s: micro-batch %d %s", topology.name, candidates[mid], "fits" if fits else "does not fit")
        lo, hi = (mid, hi) if fits else (lo, mid)
    return candidates[lo] if lo >= 0 else 0


# -- output and the command ----------------------------------------------------------------------------


def _gib(n: int | None) -> str:
    return "-" if n is None else f"{n / GiB:.2f}"


def format_report(report: TopologyReport) -> str:
    m = report.mesh
    lines = [f"{report.topology}: {report.chips} x {report.chip} (HBM {report.hbm_bytes / GiB:.2f} GiB, "
             f"{report.peak_flops / 1e12:.0f} TFLOP/s bf16 per chip); mesh data={m['data']} fsdp={m['fsdp']} "
             f"tensor={m['tensor']}; {report.architecture}",
             f"{'program':11s} {'params':>7s} {'optim':>7s} {'cache':>7s} {'other':>7s} {'temp':>7s} {'output':>7s} "
             f"{'alias':>7s} {'peak':>7s} {'resid.':>7s} {'total':>7s}  fits  {'TFLOP/chip':>10s} "
             f"{'s @' + format(report.mfu, '.0%'):>8s}"]
    for p in report.programs:
        a = p.arguments
        other = None if p.argument_bytes is None else p.argument_bytes - sum(a.get(k, 0) for k in ("params", "optimizer", "cache"))
        verdict = ("yes" if p.fits else "NO") if p.runs else ("(yes)" if p.fits else "(no)")
        flops = "-" if p.flops is None else f"{p.flops / 1e12:.1f}"
        secs = "-" if p.seconds is None else f"{p.seconds:.2f}"
        lines.append(f"{p.name:11s} {_gib(a.get('params')):>7s} {_gib(a.get('optimizer')):>7s} "
                     f"{_gib(a.get('cache')):>7s} {_gib(other):>7s} {_gib(p.temp_bytes):>7s} {_gib(p.output_bytes):>7s} "
                     f"{_gib(p.alias_bytes):>7s} {_gib(p.peak_bytes):>7s} {_gib(p.resident_bytes):>7s} "
                     f"{_gib(p.total_bytes):>7s}  "
                     f"{verdict:5s} {flops:>10s} {secs:>8s}")
        if p.error:
            lines.append(f"{'':11s} compiler: {p.error}")
    if any(not p.runs for p in report.programs):
        lines.append("(...): a program this config does not run (rollout.engine is not 'jax'); figures for reference")
    if report.largest_micro_batch is not None:
        lines.append(f"largest micro-batch that fits: {report.largest_micro_batch or 'none'}")
    lines.append("GiB per chip; peak: most bytes XLA has live at once (<= arguments + temporaries + outputs - "
                 "aliased); total = peak + resident; FLOPs run every loop to its trip count (all rows real, longest "
                 "context)")
    return "\n".join(lines)


def verdict(report: TopologyReport) -> list[str]:
    """One line per program the config runs that does not fit, naming its knobs."""
    out = []
    for p in report.programs:
        if p.runs and not p.fits:
            need = f"needs {_gib(p.total_bytes)} GiB" if p.total_bytes is not None else f"does not compile ({p.error})"
            out.append(f"{report.topology}: {p.name} {need}; a {report.chip} chip has {report.hbm_bytes / GiB:.2f} "
                       f"GiB. Lower or change: {'; '.join(p.knobs)}")
    return out


def _define_flags(values: flags.FlagValues, argv: Sequence[str]) -> None:
    # config_flags defines the --config.FIELD override flags it finds in `argv`.
    config_flags.DEFINE_config_file("config", None, "ml-collections config file (configs/*.py)", flag_values=values,
                                    sys_argv=list(argv))
    flags.mark_flag_as_required("config", flag_values=values)
    flags.DEFINE_multi_string("topology", None, f"slice(s) to compile for: {', '.join(TOPOLOGIES)}, or KIND:GRID "
                              "(e.g. v5p:2x2x2)", required=True, flag_values=values)
    flags.DEFINE_float("mfu", 0.4, "FLOP utilisation the step times assume", flag_values=values)
    flags.DEFINE_list("programs", list(PROGRAMS), "programs to compile", flag_values=values)
    flags.DEFINE_bool("search_micro_batch", False, "also find the largest micro-batch that fits (several "
                      "compiles of the update)", flag_values=values)
    flags.DEFINE_bool("json", False, "print one JSON object instead of tables", flag_values=values)


def main(argv: Sequence[str]) -> None:
    """`argv`: the command's flags (after `intraskill compile-check`)."""
    # The host only traces; with libtpu present, jax would otherwise probe for a local TPU first.
    if not os.environ.get("JAX_PLATFORMS") and not jax.config.jax_platforms:
        jax.config.update("jax_platforms", "cpu")
    prog = "intraskill compile-check"
    args = flagparse.parse(prog, __doc__, lambda v: _define_flags(v, [prog, *argv]), argv)
    try:
        config = runconfig.load(args.config)
        topologies = [parse_topology(t) for t in args.topology]
    except (runconfig.ConfigError, CompileCheckError) as e:
        raise SystemExit(f"{prog}: {e}") from None
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    reports, failures = [], []
    for topology in topologies:
        try:
            report = check(config, topology, mfu=args.mfu, programs=args.programs)
        except CompileCheckError as e:
            raise SystemExit(f"{prog}: {e}") from None
        if args.search_micro_batch:
            resident = max((p.resident_bytes for p in report.programs), default=0)
            report = dataclasses.replace(report, largest_micro_batch=largest_micro_batch(config, topology,
                                                                                         resident_bytes=resident))
        reports.append(report)
        failures += verdict(report)
        if not args.json:
            print(format_report(report) + "\n", flush=True)
    if args.json:
        print(json.dumps({"config": config.name, "topologies": [dataclasses.asdict(r) | {"fits": r.fits} for r in reports]},
                         indent=1))
    for line in failures:
        log.error("%s", line)
    if failures:
        raise SystemExit(1)
