"""The causal attention core, forward + backward, at a model's head shape: ours against torch's SDPA.

    python -m intraskill_jax.bench.attention --json                       # SmolLM2's heads, 2 x 1,024 and 2 x 3,072
    python -m intraskill_jax.bench.attention --json --tokens 1024 --block-size 64,128

Sides, each timed on the same q, k, v and output gradient (fp32):
  * `ours`: `layers.blocked_causal_attention` (the one-device form the CPU configs train with),
    its gradients by `jax.grad`, jitted;
  * `torch_sdpa`: `torch.nn.functional.scaled_dot_product_attention(is_causal=True, enable_gqa=True)`
    and its backward, on torch's CPU threads (the test extra brings torch).
Per length and block size: milliseconds of the best call of each side after a first one (ours
compiles there), the sides alternating call by call; the largest relative difference of the two
sides' gradients; and the load averages around the run: a figure counts only from a quiet machine.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Sequence

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.models import layers


def _inputs(rows: int, tokens: int, heads: int, kv_heads: int, head_dim: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(0)
    shapes = [(rows, tokens, heads, head_dim), (rows, tokens, kv_heads, head_dim), (rows, tokens, kv_heads, head_dim),
              (rows, tokens, heads, head_dim)]
    return tuple(rng.standard_normal(s).astype(np.float32) for s in shapes)


def _ours(q, k, v, d_out, block_size: int) -> Callable[[], tuple[np.ndarray, ...]]:
    valid = jnp.ones(q.shape[:2], bool)

    def loss(q, k, v):
        out = layers.blocked_causal_attention(q, k, v, valid, block_size=block_size, scale=q.shape[-1] ** -0.5)
        return jnp.sum(out * d_out)

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    args = tuple(jnp.asarray(x) for x in (q, k, v))
    return lambda: tuple(np.asarray(g) for g in jax.block_until_ready(step(*args)))


def _torch_sdpa(q, k, v, d_out) -> Callable[[], tuple[np.ndarray, ...]]:
    try:
        import torch
    except ImportError:
        raise SystemExit("the reference side needs torch: pip install -e '.[test]'") from None
    tq, tk, tv = (torch.tensor(x).transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
    t_out = torch.tensor(d_out).transpose(1, 2).contiguous()

    def step():
        out = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, is_causal=True, enable_gqa=True)
        return tuple(g.transpose(1, 2).numpy() for g in torch.autograd.grad(out, (tq, tk, tv), t_out))

    return step


def run(tokens: Sequence[int] = (1024, 3072), block_sizes: Sequence[int] = (128,), rows: int = 2, heads: int = 9,
        kv_heads: int = 3, head_dim: int = 64, rounds: int = 7) -> dict:
    result: dict = {"rows": rows, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim,
                    "device": str(jax.devices()[0]), "load_before": os.getloadavg(), "cases": []}
    for t in tokens:
        q, k, v, d_out = _inputs(rows, t, heads, kv_heads, head_dim)
        reference = _torch_sdpa(q, k, v, d_out)
        reference_grads = reference()
        for block in block_sizes:
            sides = {"ours": _ours(q, k, v, d_out, block), "torch_sdpa": reference}
            grads = {"ours": sides["ours"](), "torch_sdpa": reference_grads}
            times = {name: [] for name in sides}
            for _ in range(rounds):
                for name, fn in sides.items():
                    start = time.perf_counter()
                    fn()
                    times[name].append(time.perf_counter() - start)
            case = {"tokens": t, "block_size": block,
                    "grad_rel_diff": max(float(np.abs(a - b).max() / np.abs(b).max())
                                         for a, b in zip(grads["ours"], grads["torch_sdpa"], strict=True))}
            case.update({f"{name}_ms": min(ts) * 1e3 for name, ts in times.items()})
            case["speedup_vs_torch_sdpa"] = case["torch_sdpa_ms"] / case["ours_ms"]
            result["cases"].append(case)
    result["load_after"] = os.getloadavg()
    return result


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_list("tokens", ["1024", "3072"], "sequence lengths (tokens per row)", flag_values=values)
    flags.DEFINE_list("block-size", ["128"], "query block sizes of the blocked form", flag_values=values)
    flags.DEFINE_integer("rows", 2, "rows of the batch", flag_values=values)
    flags.DEFINE_integer("heads", 9, "query heads (SmolLM2's 9)", flag_values=values)
    flags.DEFINE_integer("kv-heads", 3, "key/value heads (SmolLM2's 3)", flag_values=values)
    flags.DEFINE_integer("head-dim", 64, "head dimension", flag_values=values)
    flags.DEFINE_integer("rounds", 7, "timed calls of each side, alternating (the best counts)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.attention", __doc__, _define_flags, argv)
    result = run([int(t) for t in args.tokens], [int(b) for b in args.block_size], args.rows, args.heads,
                 args.kv_heads, args.head_dim, args.rounds)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        json.dump(result, sys.stdout, indent=1, sort_keys=True)
        print()


if __name__ == "__main__":
    main()
