"""Model throughput: our jitted Flax NNX Qwen3.5 against transformers (PyTorch) in one run.

    python -m intraskill_jax.bench.model --json            # small CPU config
    python -m intraskill_jax.bench.model --json --size 4b  # Qwen3.5-4B shapes, bf16 (accelerator)

Both sides get the same architecture, batch and token ids (random weights each). Measured:
  * training: forward + backward of the mean next-token NLL (ours: the chunked token-logprob path
    the GRPO loss uses; transformers: `labels=` loss), tokens/s = batch x seq / step time;
  * decode: greedy generation with a cache, prefill included, tokens/s = batch x new tokens / time
    (ours: prefill + `lax.scan` over decode steps in one jit; transformers: a manual loop over
    `past_key_values`, which avoids `generate`'s per-step overhead and so is the stronger peer).
Every timing is a median over repeats after a warm-up; JAX results are blocked on.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

# XLA:CPU runs triangular_solve through LAPACK (scipy's OpenBLAS); OpenBLAS's own thread pool,
# woken for each of the hundreds of tiny per-chunk solves, made the DeltaNet step ~100x slower
# and competes with XLA's threads. Must be set before OpenBLAS loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from intraskill_jax.models import (
    ModelConfig,
    Qwen3_5ForCausalLM,
    init_cache,
    logprobs_from_hidden,
)

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class BenchShape:
    batch: int
    seq: int
    decode_batch: int
    prompt: int
    new_tokens: int
    repeats: int


SIZES: dict[str, tuple[Callable[[], ModelConfig], BenchShape]] = {
    "small": (
        lambda: ModelConfig(
            family="qwen3_5",
            vocab_size=8192,
            hidden_size=256,
            intermediate_size=768,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=64,
            rope_theta=1e7,
            partial_rotary_factor=0.25,
            linear_num_key_heads=4,
            linear_num_value_heads=8,
            linear_key_head_dim=32,
            linear_value_head_dim=32,
            linear_conv_kernel_dim=4,
            tie_word_embeddings=True,
            dtype="float32",
            param_dtype="float32",
        ),
        BenchShape(batch=4, seq=512, decode_batch=8, prompt=64, new_tokens=64, repeats=3),
    ),
    "4b": (
        lambda: ModelConfig.qwen3_5_4b(dtype="bfloat16", param_dtype="bfloat16", remat="full"),
        BenchShape(batch=4, seq=2048, decode_batch=64, prompt=512, new_tokens=128, repeats=3),
    ),
}


def _median_seconds(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up (compilation, allocator)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


# --------------------------------------------------------------------------- ours
def _ours(
    config: ModelConfig, shape: BenchShape, train_ids: np.ndarray, prompt: np.ndarray
) -> tuple[float, float]:
    model = Qwen3_5ForCausalLM(config, rngs=nnx.Rngs(0))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    def nll(params: Any, ids: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, params, rest)
        hidden, _ = m.hidden_states(ids[:, :-1])
        lp = logprobs_from_hidden(
            hidden,
            m.output_embedding(),
            ids[:, 1:],
            chunk_size=config.logits_chunk_size,
            compute_dtype=config.compute_dtype,
        )
        return -jnp.mean(lp)

    train_step = jax.jit(jax.value_and_grad(nll))
    ids = jnp.asarray(train_ids)
    train_s = _median_seconds(lambda: jax.block_until_ready(train_step(params, ids)), shape.repeats)

    @jax.jit
    def generate(params: Any, prompt: jax.Array) -> jax.Array:
        m = nnx.merge(graphdef, params, rest)
        b, p = prompt.shape
        cache = init_cache(config, b, p + shape.new_tokens)
        logits, cache = m(prompt, jnp.ones_like(prompt), cache=cache)
        first = jnp.argmax(logits[:, -1], axis=-1).astype(prompt.dtype)

        def step(carry, _):
            token, cache = carry
            logits, cache = m(token[:, None], jnp.ones_like(token[:, None]), cache=cache)
            nxt = jnp.argmax(logits[:, -1], axis=-1).astype(token.dtype)
            return (nxt, cache), nxt

        _, rest_tokens = jax.lax.scan(step, (first, cache), None, length=shape.new_tokens - 1)
        return jnp.concatenate([first[:, None], rest_tokens.T], axis=1)

    prompt_ids = jnp.asarray(prompt)
    decode_s = _median_seconds(
        lambda: jax.block_until_ready(generate(params, prompt_ids)), shape.repeats
    )
    return train_s, decode_s


# --------------------------------------------------------------------------- transformers
def _reference(
    config: ModelConfig, shape: BenchShape, train_ids: np.ndarray, prompt: np.ndarray
) -> tuple[float, float]:
    import torch
    from transformers import Qwen3_5ForCausalLM as HFModel
    from transformers import Qwen3_5TextConfig

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, config.dtype)
    hf = config.to_hf_dict()
    hf.pop("model_type"), hf.pop("architectures")
    torch.manual_seed(0)
    model = HFModel(Qwen3_5TextConfig(**hf)).to(device=device, dtype=dtype)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    ids = torch.as_tensor(train_ids, device=device)

    def train_step() -> None:
        model.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids).loss.backward()
        sync()

    model.train()
    train_s = _median_seconds(train_step, shape.repeats)
    model.zero_grad(set_to_none=True)
    model.eval()
    prompt_t = torch.as_tensor(prompt, device=device)

    @torch.inference_mode()
    def generate() -> None:
        out = model(input_ids=prompt_t, use_cache=True)
        token = out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(shape.new_tokens - 1):
            out = model(input_ids=token, past_key_values=out.past_key_values, use_cache=True)
            token = out.logits[:, -1].argmax(-1, keepdim=True)
        sync()

    decode_s = _median_seconds(generate, shape.repeats)
    return train_s, decode_s


# --------------------------------------------------------------------------- report
def _peak_gib() -> float:
    """Device peak where the backend reports it, else this process's peak RSS."""
    stats = jax.devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
        return stats["peak_bytes_in_use"] / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30


def run(size: str = "small", skip_reference: bool = False) -> dict[str, Any]:
    config, shape = SIZES[size][0](), SIZES[size][1]
    rng = np.random.default_rng(0)
    train_ids = rng.integers(0, config.vocab_size, (shape.batch, shape.seq + 1), dtype=np.int64)
    prompt = rng.integers(0, config.vocab_size, (shape.decode_batch, shape.prompt), dtype=np.int64)
    train_s, decode_s = _ours(config, shape, train_ids.astype(np.int32), prompt.astype(np.int32))
    peak = _peak_gib()  # before torch runs, so RSS reflects our side only
    train_tokens = shape.batch * shape.seq
    decode_tokens = shape.decode_batch * shape.new_tokens
    result: dict[str, Any] = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind} x{jax.device_count()}",
        "config": {
            "size": size,
            **dataclasses.asdict(shape),
            **{
                k: v
                for k, v in config.to_hf_dict().items()
                if k
                in (
                    "hidden_size",
                    "num_hidden_layers",
                    "intermediate_size",
                    "vocab_size",
                    "layer_types",
                )
            },
            "dtype": config.dtype,
            "remat": config.remat,
            "threads": os.cpu_count(),
        },
        "train_tokens_per_s": train_tokens / train_s,
        "decode_tokens_per_s": decode_tokens / decode_s,
        "peak_memory_gib": peak,
    }
    if not skip_reference:
        ref_train_s, ref_decode_s = _reference(config, shape, train_ids[:, :-1], prompt)
        result.update(
            train_tokens_per_s_ref=train_tokens / ref_train_s,
            decode_tokens_per_s_ref=decode_tokens / ref_decode_s,
            train_speedup=ref_train_s / train_s,
            decode_speedup=ref_decode_s / decode_s,
        )
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument(
        "--skip-reference", action="store_true", help="time only our model (no transformers run)"
    )
    args = parser.parse_args(argv)
    result = run(args.size, args.skip_reference)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:28s} {value}")


if __name__ == "__main__":
    main()
