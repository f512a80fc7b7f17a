"""Model throughput: our jitted Flax NNX models against transformers (PyTorch) in one run.

    python -m intraskill_jax.bench.model --json                     # small Qwen3.5 config, both kernel sets
    python -m intraskill_jax.bench.model --json --size quickstart   # the CPU quickstart's policy
    python -m intraskill_jax.bench.model --json --size smollm2      # SmolLM2-135M (Llama), the pretrained CPU run's
    python -m intraskill_jax.bench.model --json --size 4b           # Qwen3.5-4B shapes, bf16 (accelerator)

Both sides get the same architecture, batch and token ids (random weights each). Measured:
  * train: forward + backward of the mean next-token NLL (ours: the chunked token-logprob path
    the GRPO loss uses; transformers: `labels=` loss), tokens/s = batch x seq / step time;
  * prefill: a batch of prompts into an empty cache, logits of the last position only (ours: the
    sampler's jitted `prefill`; transformers: `logits_to_keep=1`), tokens/s = batch x prompt / time;
  * decode: greedy steps from that pre-filled cache (its prefill runs first, untimed), tokens/s =
    batch x new tokens / time (ours: the sampler's jitted `decode` loop, with its sampling, log-probs
    and stop checks; transformers: a manual loop over `past_key_values`, which avoids `generate`'s
    per-step overhead and so is the stronger peer);
  * generate: prefill and decode together, tokens/s = batch x new tokens / time;
  * turn: a later turn of a multi-turn session, `prompt` new tokens per row onto `history` tokens
    already cached (their prefill untimed), last-position logits; ours in a cache of `cache_slots`
    slots, as the sampler sizes it for sessions that grow (transformers' cache holds the history
    exactly), tokens/s = batch x prompt / time.
Ours runs once per kernel set (`--kernels`): `default` (DeltaNet chunks of 64, one fused
attention: the GPU/TPU shapes) and `cpu` (chunks of 16, causal attention in query blocks of 128,
the decode cache read in blocks of 512 slots, the sampler reading [in, out] weight copies: what the
CPU quickstart uses). Decode's cache holds exactly prompt + new tokens; `turn` shows the sampler's
cache partly filled, as rollouts run it.
Everything is warmed up first (compilation excluded), then timed in alternating rounds, ours and
transformers taking turns; each side's best round counts, since load from other processes only ever
slows a run down. The JSON carries every round, the CPU seconds of the best ones (a cross-check
less tied to load) and the load averages around the run: a figure counts only from a quiet machine.
It also carries the FLOPs of a training step and of a decode step (XLA's cost analysis), the
device's matmul rate, the bytes of weights a decode step reads and the rate XLA reads that many
bytes, and from them the ratios no implementation could beat at the rates measured here: the
reference's time over ours with every FLOP at the matmul peak (`train_speedup_bound_*`), and for a
decode step the larger of that and its weights read once (`decode_speedup_bound_*`); and the time
of a decode step's weight products at their own shapes, chained on their own with the slices that
link them (`decode_products_us_per_step_*`: an estimate of what a step spends in them, not a bound;
ours has run at 0.85-1.08x of it at the small size). The rates and the products are probed in every
round (best kept), as the tasks are timed. And the host
allocator (`intraskill_jax/allocator.py`; the benchmark picks it as `intraskill` does).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import resource
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

# XLA:CPU runs triangular_solve through LAPACK (scipy's OpenBLAS); OpenBLAS's own thread pool,
# woken for each of the hundreds of tiny per-chunk solves, made the DeltaNet step ~100x slower
# and competes with XLA's threads. Must be set before OpenBLAS loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.models import (
    ModelConfig,
    causal_lm_class,
    hf_config,
    init_cache,
    logprobs_from_hidden,
)
from intraskill_jax.models.layers import Linear

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchShape:
    batch: int
    seq: int
    decode_batch: int
    prompt: int
    new_tokens: int
    history: int
    cache_slots: int


SIZES: dict[str, tuple[Callable[[], ModelConfig], BenchShape]] = {
    "small": (
        lambda: ModelConfig.tiny_qwen3_5(
            vocab_size=8192, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=64, rope_theta=1e7, partial_rotary_factor=0.25,
            linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32, linear_value_head_dim=32,
            linear_conv_kernel_dim=4, tie_word_embeddings=True, dtype="float32", param_dtype="float32",
        ),
        BenchShape(batch=4, seq=512, decode_batch=8, prompt=64, new_tokens=64, history=448, cache_slots=1024),
    ),
    # configs/quickstart.py's policy (vocabulary as its tokenizer ends up) at an SFT batch and at
    # the rollout batch of the quickstart's sampler.
    "quickstart": (
        lambda: ModelConfig.tiny_qwen3_5(
            vocab_size=1024, hidden_size=128, intermediate_size=384, num_hidden_layers=2,
            layer_types=("linear_attention", "full_attention"), num_attention_heads=4, num_key_value_heads=2,
            head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
            linear_value_head_dim=32, tie_word_embeddings=True,
        ),
        BenchShape(batch=8, seq=1024, decode_batch=32, prompt=128, new_tokens=32, history=896,
                   cache_slots=2048),
    ),
    # SmolLM2-135M (configs/smollm2_cpu.py's policy) at an SFT micro-batch and a rollout batch of its
    # sampler; a turn appends an observation of ~128 tokens to a history of ~768.
    "smollm2": (
        lambda: ModelConfig.smollm2_135m(dtype="float32", param_dtype="float32"),
        BenchShape(batch=2, seq=1024, decode_batch=16, prompt=128, new_tokens=32, history=768,
                   cache_slots=2048),
    ),
    "4b": (
        lambda: ModelConfig.qwen3_5_4b(dtype="bfloat16", param_dtype="bfloat16", remat="full"),
        BenchShape(batch=4, seq=2048, decode_batch=64, prompt=512, new_tokens=128, history=2048,
                   cache_slots=8192),
    ),
}
# name -> the ModelConfig kernel fields it sets
KERNELS: dict[str, dict[str, int | bool]] = {
    "default": {"gdn_chunk_size": 64, "attention_block_size": 0, "cache_block_size": 0,
                "transpose_decode_weights": False},
    "cpu": {"gdn_chunk_size": 16, "attention_block_size": 128, "cache_block_size": 512,
            "transpose_decode_weights": True},
}


def _timed(fn: Callable[[], Any]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


# A side is one callable per task; each returns the wall and CPU seconds of its timed part only
# (decode is timed from a pre-filled cache: its prefill runs first, untimed).
Task = Callable[[], tuple[float, float]]
TASKS = ("train", "prefill", "decode", "generate", "turn")


def _flops(lowered: Any) -> float | None:
    """FLOPs of a lowered program by XLA's cost analysis (no compile); None where the backend has
    none before compiling (XLA:GPU under jax 0.11)."""
    cost = lowered.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return float(cost["flops"]) if cost and "flops" in cost else None


def _ours(config: ModelConfig, shape: BenchShape, train_ids: np.ndarray, prompt: np.ndarray,
          history: np.ndarray) -> tuple[dict[str, Task], dict[str, float], Callable[[], float]]:
    """The sampler's own jitted `prefill` and `decode` (rollout/jax_sampler.py: last-position logits, the
    sampling and stop checks of every step), greedy, and the trainer's token-logprob loss; warmed up.
    Also the FLOPs of a training step and of one decode step (one token per row onto the cache, the
    head included), by XLA's cost analysis of the lowered programs, and a timer of a decode step's
    weight products on their own (`_decode_products_timer`)."""
    from intraskill_jax.rollout import jax_sampler

    model = causal_lm_class(config)(config, rngs=nnx.Rngs(0))
    graphdef, state = nnx.split(jax_sampler.for_sampling(model))
    g_train, p_train, r_train = nnx.split(model, nnx.Param, ...)

    def nll(params: Any, ids: jax.Array) -> jax.Array:
        m = nnx.merge(g_train, params, r_train)
        hidden, _ = m.hidden_states(ids[:, :-1])
        lp = logprobs_from_hidden(hidden, m.output_embedding(), ids[:, 1:], chunk_size=config.logits_chunk_size,
                                  compute_dtype=config.compute_dtype)
        return -jnp.mean(lp)

    train_step = jax.jit(jax.value_and_grad(nll))
    ids, prompt_ids = jnp.asarray(train_ids), jnp.asarray(prompt)
    mask = jnp.ones_like(prompt_ids, bool)
    b, p = prompt.shape
    active, key, stop = jnp.ones((b,), bool), jax.random.key(0), jnp.asarray([-1], jnp.int32)

    def prefill() -> tuple[jax.Array, Any]:
        cache = init_cache(config, b, p + shape.new_tokens)
        return jax_sampler.prefill(graphdef, state, cache, prompt_ids, mask)

    def decode(logits: jax.Array, cache: Any) -> jax.Array:
        tokens, *_ = jax_sampler.decode(graphdef, state, cache, logits, key, active, jnp.float32(0.0),
                                        jnp.float32(1.0), stop, jnp.int32(shape.new_tokens),
                                        steps=shape.new_tokens, top_k=0)
        return tokens

    def timed_decode() -> tuple[float, float]:
        logits, cache = jax.block_until_ready(prefill())
        return _timed(lambda: jax.block_until_ready(decode(logits, cache)))

    def timed_turn() -> tuple[float, float]:
        cache = init_cache(config, b, shape.cache_slots)
        for piece in np.array_split(history, -(-history.shape[1] // 256), axis=1):
            _, cache = jax_sampler.prefill(graphdef, state, cache, jnp.asarray(piece), jnp.ones(piece.shape, bool))
        jax.block_until_ready(cache)
        return _timed(lambda: jax.block_until_ready(jax_sampler.prefill(graphdef, state, cache, prompt_ids, mask)))

    tasks: dict[str, Task] = {
        "train": lambda: _timed(lambda: jax.block_until_ready(train_step(p_train, ids))),
        "prefill": lambda: _timed(lambda: jax.block_until_ready(prefill())),
        "decode": timed_decode,
        "generate": lambda: _timed(lambda: jax.block_until_ready(decode(*prefill()))),
        "turn": timed_turn,
    }
    for task in tasks.values():
        task()
    one_step = jax_sampler.prefill.lower(graphdef, state, init_cache(config, b, p + shape.new_tokens),
                                         prompt_ids[:, :1], mask[:, :1])
    flops = {"train": _flops(train_step.lower(p_train, ids)), "decode": _flops(one_step)}
    return tasks, flops, _decode_products_timer(nnx.merge(graphdef, state), b)


def _decode_products(sampling_model: nnx.Module, rows: int, passes: int) -> tuple[Callable[..., jax.Array], tuple]:
    """A decode step's weight products alone, `passes` times in a loop, and its arguments: each linear
    layer's and the head's product for `rows` rows, at their shapes and in the layout the sampler
    reads them, in one chain (each product reads the last one's output, sliced or tiled to its
    width). The weights are 0/1 selections of their shape: values never grow, shrink or turn
    denormal, and a dense product's cost does not depend on them."""
    # (weight, "io" for [in, out] or "oi" for HF's [out, in]): the layers' linears, then the head
    # (an untied head is a Linear too, outside `.model`).
    layouts = []
    for _, module in nnx.iter_modules(sampling_model.model):
        if isinstance(module, Linear):
            layouts.append((module.weight[...], "oi") if module.weight_t is None else (module.weight_t[...], "io"))
    head_t = sampling_model.output_embedding_t
    layouts.append((sampling_model.output_embedding(), "oi") if head_t is None else (head_t[...], "io"))
    specs = [spec for _, spec in layouts]
    hidden = sampling_model.config.hidden_size

    def fit(x: jax.Array, width: int) -> jax.Array:
        return jnp.tile(x, (1, -(-width // x.shape[1])))[:, :width]

    def step(_, carry: tuple[jax.Array, list[jax.Array]]) -> tuple[jax.Array, list[jax.Array]]:
        x, weights = carry
        for spec, w in zip(specs, weights):
            x = jnp.einsum(f"bi,{spec}->bo", fit(x, w.shape[spec.index("i")]), w)
        return fit(x, hidden), weights

    chain = jax.jit(lambda x, weights: jax.lax.fori_loop(0, passes, step, (x, weights))[0])
    eyes = [jnp.eye(*w.shape, dtype=w.dtype) for w, _ in layouts]
    return chain, (jnp.ones((rows, hidden), eyes[0].dtype), eyes)


def _decode_products_timer(sampling_model: nnx.Module, rows: int, passes: int = 20) -> Callable[[], float]:
    """A warmed-up timer: seconds per step of `passes` steps' weight products run on their own
    (`_decode_products`). A decode step runs these products and more (attention, recurrences, norms,
    sampling), yet it has run up to 15% faster than the chain, whose slices and tilings between
    products cost kernels of their own: an estimate of a step's product time, not a bound."""
    chain, args = _decode_products(sampling_model, rows, passes)
    jax.block_until_ready(chain(*args))
    return lambda: _timed(lambda: jax.block_until_ready(chain(*args)))[0] / passes


def _decode_weight_bytes(config: ModelConfig) -> int:
    """Bytes of the weights any decode step reads in full: every parameter but an untied input
    embedding, of which a step reads only its batch's rows."""
    model = nnx.eval_shape(lambda: causal_lm_class(config)(config, rngs=nnx.Rngs(0)))
    total = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    if not config.tie_word_embeddings:
        total -= config.vocab_size * config.hidden_size * jnp.dtype(config.params_dtype).itemsize
    return total


def _read_rate(nbytes: int, passes: int = 20) -> Callable[[], float]:
    """A warmed-up probe of the rate (GB/s) at which XLA reads a buffer of `nbytes` it has just read
    (so from whichever cache level holds that much), as a decode step reads its weights: one run of
    `passes` reductions over it (each pass depends on the last, so none is hoisted out of the loop)."""
    a = jnp.ones((max(nbytes // 4, 1),), jnp.float32)
    reads = jax.jit(lambda a: jax.lax.fori_loop(0, passes, lambda _, acc: jnp.sum(a + acc) * 1e-9, jnp.float32(0)))
    jax.block_until_ready(reads(a))
    return lambda: passes * a.nbytes / _timed(lambda: jax.block_until_ready(reads(a)))[0] / 1e9


def _matmul_rate(dtype: jnp.dtype) -> Callable[[], float]:
    """A warmed-up probe of this device's matrix-multiply rate (GFLOP/s) through XLA in `dtype`: one
    square product, 2,048 on a CPU, 8,192 on an accelerator, what a training step of nothing but
    large matmuls could reach."""
    n = 2048 if jax.devices()[0].platform == "cpu" else 8192
    a = jnp.ones((n, n), dtype)
    product = jax.jit(jnp.dot)
    jax.block_until_ready(product(a, a))
    return lambda: 2 * n**3 / _timed(lambda: jax.block_until_ready(product(a, a)))[0] / 1e9


# --------------------------------------------------------------------------- transformers
def transformers_copy(model: nnx.Module) -> Any:
    """`model`'s weights in transformers' own class for its family, float32 on the CPU (a checkpoint
    written by `save_pretrained` and read back; LoRA adapters are merged into it)."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from intraskill_jax.models.params import save_pretrained

    with tempfile.TemporaryDirectory() as directory:
        save_pretrained(model, directory)
        return AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32)


def _reference(config: ModelConfig, shape: BenchShape, train_ids: np.ndarray, prompt: np.ndarray,
               history: np.ndarray) -> dict[str, Task]:
    import torch
    import transformers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, config.dtype)
    hf = hf_config(config)
    hf.pop("model_type"), hf.pop("architectures")
    torch.manual_seed(0)
    model_class, config_class = {"qwen3_5": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig"),
                                 "qwen3": ("Qwen3ForCausalLM", "Qwen3Config"),
                                 "llama": ("LlamaForCausalLM", "LlamaConfig")}[config.family]
    model = getattr(transformers, model_class)(getattr(transformers, config_class)(**hf)).to(device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = torch.as_tensor(train_ids, device=device)
    prompt_t = torch.as_tensor(prompt, device=device)
    history_t = torch.as_tensor(history, device=device)

    def train() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        sync()

    @torch.inference_mode()
    def prefill() -> Any:
        model.eval()
        out = model(input_ids=prompt_t, use_cache=True, logits_to_keep=1)  # the last position only, as ours
        sync()
        return out

    # A manual loop over past_key_values: it avoids `generate`'s per-step overhead, so it is the stronger peer.
    @torch.inference_mode()
    def decode(out: Any) -> None:
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(shape.new_tokens - 1):
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()

    def timed_decode() -> tuple[float, float]:
        out = prefill()
        return _timed(lambda: decode(out))

    @torch.inference_mode()
    def timed_turn() -> tuple[float, float]:
        model.eval()
        cache = model(input_ids=history_t, use_cache=True, logits_to_keep=1).past_key_values
        sync()

        def turn() -> None:
            model(input_ids=prompt_t, past_key_values=cache, use_cache=True, logits_to_keep=1)
            sync()

        return _timed(turn)

    tasks: dict[str, Task] = {
        "train": lambda: _timed(train),
        "prefill": lambda: _timed(prefill),
        "decode": timed_decode,
        "generate": lambda: _timed(lambda: decode(prefill())),
        "turn": timed_turn,
    }
    for task in tasks.values():
        task()
    return tasks


# --------------------------------------------------------------------------- report
def _peak_gib() -> float:
    """Device peak where the backend reports it, else this process's peak RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def run(size: str = "small", kernels: tuple[str, ...] = tuple(KERNELS), rounds: int = 3,
        skip_reference: bool = False) -> dict[str, Any]:
    config, shape = SIZES[size][0](), SIZES[size][1]
    rng = np.random.default_rng(0)
    train_ids = rng.integers(0, config.vocab_size, (shape.batch, shape.seq + 1), dtype=np.int64)
    prompt = rng.integers(0, config.vocab_size, (shape.decode_batch, shape.prompt), dtype=np.int64)
    history = rng.integers(0, config.vocab_size, (shape.decode_batch, shape.history), dtype=np.int64)
    sides: dict[str, dict[str, Task]] = {}
    flops: dict[str, dict[str, float]] = {}
    products: dict[str, Callable[[], float]] = {}  # per kernel set: a decode step's products on their own
    for name in kernels:
        sides[name], flops[name], products[name] = _ours(
            dataclasses.replace(config, **KERNELS[name]), shape, train_ids.astype(np.int32), prompt.astype(np.int32),
            history.astype(np.int32))
    weight_bytes = _decode_weight_bytes(config)
    rates = {"matmul_peak_gflops": _matmul_rate(config.compute_dtype), "weights_read_gbps": _read_rate(weight_bytes)}
    peak = _peak_gib()  # before torch runs, so RSS reflects our side only
    if not skip_reference:
        sides["transformers"] = _reference(config, shape, train_ids[:, :-1], prompt, history)
    load_before = os.getloadavg()
    times: dict[str, dict[str, list[tuple[float, float]]]] = {n: {t: [] for t in TASKS} for n in sides}
    # The probes run in the rounds too, so that they see the load the tasks see; each keeps its best.
    product_seconds: dict[str, list[float]] = {n: [] for n in products}
    rates_seen: dict[str, list[float]] = {n: [] for n in rates}
    for r in range(rounds):
        for name, tasks in sides.items():
            for task, fn in tasks.items():
                times[name][task].append(fn())
                # One line per timing on stderr: a run cut off by a time limit (a lent
                # accelerator's) still leaves every figure it took.
                print(json.dumps({"round": r, "side": name, "task": task, "wall_s": times[name][task][-1][0]}),
                      file=sys.stderr, flush=True)
        for name, timer in products.items():
            product_seconds[name].append(timer())
        for name, probe in rates.items():
            rates_seen[name].extend(probe() for _ in range(3))
    matmul_gflops, read_gbps = max(rates_seen["matmul_peak_gflops"]), max(rates_seen["weights_read_gbps"])
    load_after = os.getloadavg()
    generated = shape.decode_batch * shape.new_tokens
    work = {"train": shape.batch * shape.seq, "prefill": shape.decode_batch * shape.prompt, "decode": generated,
            "generate": generated, "turn": shape.decode_batch * shape.prompt}
    result: dict[str, Any] = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind} x{jax.device_count()}",
        "config": {
            "size": size, **dataclasses.asdict(shape), "rounds": rounds,
            **{k: v for k, v in hf_config(config).items()
               if k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "layer_types")},
            "dtype": config.dtype, "remat": config.remat, "kernels": {n: KERNELS[n] for n in kernels},
            "threads": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after,
            "allocator": allocator.active(),
        },
        "peak_memory_gib": peak,
        "matmul_peak_gflops": matmul_gflops,
        "decode_weight_mib": weight_bytes / 2**20,
        "weights_read_gbps": read_gbps,
    }
    for name, per_task in times.items():
        for task, runs in per_task.items():
            wall, cpu = min(runs)
            result[f"{task}_tokens_per_s_{name}"] = work[task] / wall
            result[f"{task}_cpu_seconds_{name}"] = cpu
            result[f"{task}_seconds_all_{name}"] = [round(w, 4) for w, _ in runs]
    for name, per_task in flops.items():
        result[f"train_gflop_per_step_{name}"] = per_task["train"] and per_task["train"] / 1e9
        result[f"decode_mflop_per_step_{name}"] = per_task["decode"] and per_task["decode"] / 1e6
        result[f"decode_products_us_per_step_{name}"] = min(product_seconds[name]) * 1e6
    if not skip_reference:
        # The ratios no implementation could beat at the rates measured: the reference's time over
        # ours with every FLOP at the matmul peak above and, for a decode step, the larger of that
        # and its weights read once at the rate measured for that many bytes (the reference does at
        # least this work).
        reference_train = work["train"] / result["train_tokens_per_s_transformers"]
        reference_step = shape.decode_batch / result["decode_tokens_per_s_transformers"]
        for name, per_task in flops.items():
            if per_task["train"] is None or per_task["decode"] is None:
                continue
            result[f"train_speedup_bound_{name}"] = reference_train / (per_task["train"] / (matmul_gflops * 1e9))
            floor = max(per_task["decode"] / (matmul_gflops * 1e9), weight_bytes / (read_gbps * 1e9))
            result[f"decode_speedup_bound_{name}"] = reference_step / floor
        for name in kernels:
            for task in work:
                result[f"{task}_speedup_{name}"] = (result[f"{task}_tokens_per_s_{name}"]
                                                    / result[f"{task}_tokens_per_s_transformers"])
    return result


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_enum("size", "small", sorted(SIZES), "model shapes", flag_values=values)
    flags.DEFINE_list("kernels", list(KERNELS), f"kernel sets of our model, comma-separated ({', '.join(KERNELS)})",
                      flag_values=values)
    flags.register_validator("kernels", lambda ks: bool(ks) and set(ks) <= set(KERNELS),
                             f"one or more of {', '.join(KERNELS)}", flag_values=values)
    flags.DEFINE_integer("rounds", 3, "alternating timed rounds (each side's best counts)", flag_values=values)
    flags.DEFINE_bool("skip-reference", False, "time only our model (no transformers run)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.model", __doc__, _define_flags, argv)
    result = run(args.size, tuple(args.kernels), args.rounds, args.skip_reference)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:34s} {value}")


if __name__ == "__main__":
    main()
