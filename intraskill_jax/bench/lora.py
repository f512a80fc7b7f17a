"""LoRA against full fine-tuning: a GRPO update's speed, and what a weight push to the sampler costs.

    python -m intraskill_jax.bench.lora --json                    # a 33M-parameter Llama (SmolLM2's layers)
    python -m intraskill_jax.bench.lora --json --size quickstart  # the CPU quickstart's policy

Both sides are the same model (same initial weights) and the same batch. Measured:
  * train: one GRPO update (`rl.train_step.grpo_step`, as the learner runs it: forward, backward,
    AdamW) on a batch of `rows` x `seq` tokens, the second half of each row trained; full
    fine-tuning against LoRA (rank `rank`, the default targets), tokens/s = rows x seq / step time;
    `train_speedup_lora` = full time / LoRA time;
  * the push rule (`rl.learner.Learner._push_weights`): the sampler can be handed the adapted model
    itself (each decode step then runs the adapters' low-rank products) or the adapters merged into
    the weights (one merge per push, then decode steps cost what a plain model's do). Timed with
    the embedded sampler's own jitted `prefill` and `decode` (CPU kernel set, greedy) on the
    adapted model and on the merged one, and `models.lora.merged` itself:
    `merge_ms` per push, `decode_extra_ms_per_step_adapters` (adapted minus merged, per step of
    `decode_batch` rows) and `push_break_even_decode_steps` = the first over the second, the decode
    steps a push must be followed by for merging to pay; and a prefill of `decode_batch` x `prompt`
    tokens on each (`prefill_ms_*`: the adapters cost every turn's prefill something too).
Everything is compiled and warmed up first, then timed in alternating rounds (the sides' order
swapped each round); each side's best round counts, since load from other processes only slows a
run down. The JSON carries every round, and the load averages around the run: a figure counts only
from a quiet machine.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as bench.model: before OpenBLAS loads

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags
from flax import nnx

from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.bench import model as model_bench
from intraskill_jax.models import ModelConfig, causal_lm_class, init_cache
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.grpo import LossConfig


@dataclasses.dataclass(frozen=True, kw_only=True)
class Shape:
    rows: int
    seq: int
    decode_batch: int
    prompt: int
    new_tokens: int


SIZES: dict[str, tuple[Callable[[], ModelConfig], Shape]] = {
    # SmolLM2-135M's layers (hidden 576, 9/3 heads, MLP 1536), 8 of its 30, a vocabulary of 8,192:
    # 33M parameters, 28M of them in the adapted projections.
    "30m": (lambda: ModelConfig.smollm2_135m(num_hidden_layers=8, vocab_size=8192, dtype="float32",
                                             param_dtype="float32", **model_bench.KERNELS["cpu"]),
            Shape(rows=4, seq=512, decode_batch=16, prompt=128, new_tokens=64)),
    "quickstart": (lambda: dataclasses.replace(model_bench.SIZES["quickstart"][0](), **model_bench.KERNELS["cpu"]),
                   Shape(rows=8, seq=1024, decode_batch=32, prompt=128, new_tokens=64)),
}


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _train_tasks(config: ModelConfig, shape: Shape, lora: LoRAConfig) -> tuple[dict[str, Callable[[], float]],
                                                                               dict[str, int]]:
    """One warmed-up GRPO update per side (full fine-tuning, LoRA) and each side's trained parameters."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, config.vocab_size, (shape.rows, shape.seq)).astype(np.int32)
    loss_mask = np.zeros(tokens.shape, np.float32)
    loss_mask[:, shape.seq // 2:] = 1
    collated = {"tokens": tokens, "attention_mask": np.ones_like(tokens), "loss_mask": loss_mask}
    batch = ts.train_batch(collated, advantages=rng.normal(size=shape.rows).astype(np.float32))
    optim = ts.OptimConfig(learning_rate=1e-5)
    tasks, trained = {}, {}
    for name in ("full", "lora"):
        model = causal_lm_class(config)(config, rngs=nnx.Rngs(0))
        if name == "lora":
            lora_lib.apply_lora(model, lora)
        tx = ts.make_optimizer(optim)
        graphdef, state = ts.init_train_state(model, tx)
        trained[name] = sum(x.size for x in jax.tree.leaves(ts.trainable_params(state.params)))
        step = ts.grpo_step(graphdef, tx, optim, LossConfig(), temperature=1.0)
        holder = {"state": state}

        def run(step=step, holder=holder) -> float:
            def once() -> None:
                holder["state"], metrics = step(holder["state"], batch)
                jax.block_until_ready(metrics)

            return _timed(once)

        run()
        tasks[name] = run
    return tasks, trained


def _push_tasks(config: ModelConfig, shape: Shape, lora: LoRAConfig) -> dict[str, Callable[[], float]]:
    """Warmed-up timers: a merge, and `new_tokens` decode steps of the sampler on the adapted model
    and on the merged one (from a pre-filled cache; the prefill untimed)."""
    from intraskill_jax.rollout import jax_sampler

    model = lora_lib.apply_lora(causal_lm_class(config)(config, rngs=nnx.Rngs(0)), lora)
    adapters = nnx.state(model, nnx.LoRAParam)  # trained-looking adapters: B off zero
    nnx.update(model, jax.tree.map(lambda x: x + 0.01, adapters))
    prompt = jnp.asarray(np.random.default_rng(1).integers(1, config.vocab_size, (shape.decode_batch, shape.prompt)),
                         jnp.int32)
    mask = jnp.ones(prompt.shape, bool)
    active, key, stop = jnp.ones((shape.decode_batch,), bool), jax.random.key(0), jnp.asarray([-1], jnp.int32)

    def sampler_timers(sampling_model: nnx.Module) -> tuple[Callable[[], float], Callable[[], float]]:
        graphdef, state = nnx.split(jax_sampler.for_sampling(sampling_model))
        prefilled: dict[str, Any] = {}

        def prefill() -> float:
            cache = init_cache(config, shape.decode_batch, shape.prompt + shape.new_tokens)
            seconds = _timed(lambda: prefilled.update(out=jax.block_until_ready(
                jax_sampler.prefill(graphdef, state, cache, prompt, mask))))
            return seconds

        def decode() -> float:
            prefill()
            logits, cache = prefilled.pop("out")
            return _timed(lambda: jax.block_until_ready(jax_sampler.decode(
                graphdef, state, cache, logits, key, active, jnp.float32(0.0), jnp.float32(1.0), stop,
                jnp.int32(shape.new_tokens), steps=shape.new_tokens, top_k=0)))

        decode()
        return prefill, decode

    def merge() -> float:
        return _timed(lambda: jax.block_until_ready(jax.tree.leaves(nnx.state(lora_lib.merged(model)))))

    merge()
    prefill_adapters, decode_adapters = sampler_timers(model)
    prefill_merged, decode_merged = sampler_timers(lora_lib.merged(model))
    return {"merge": merge, "decode_adapters": decode_adapters, "decode_merged": decode_merged,
            "prefill_adapters": prefill_adapters, "prefill_merged": prefill_merged}


def run(size: str = "30m", rounds: int = 3, rank: int = 8) -> dict[str, Any]:
    config, shape = SIZES[size][0](), SIZES[size][1]
    lora = LoRAConfig(enabled=True, rank=rank, alpha=2.0 * rank)
    train, trained = _train_tasks(config, shape, lora)
    push = _push_tasks(config, shape, lora)
    load_before = os.getloadavg()
    seconds: dict[str, list[float]] = {name: [] for name in (*train, *push)}
    for r in range(rounds):
        for tasks in (train, push):
            for name in (list(tasks) if r % 2 == 0 else list(tasks)[::-1]):
                seconds[name].append(tasks[name]())
    load_after = os.getloadavg()
    best = {name: min(times) for name, times in seconds.items()}
    total = sum(x.size for x in jax.tree.leaves(nnx.state(nnx.eval_shape(
        lambda: causal_lm_class(config)(config, rngs=nnx.Rngs(0))), nnx.Param)))
    extra = (best["decode_adapters"] - best["decode_merged"]) / shape.new_tokens
    result: dict[str, Any] = {
        "device": f"{jax.devices()[0].platform}:{jax.devices()[0].device_kind} x{jax.device_count()}",
        "config": {"size": size, **dataclasses.asdict(shape), "rounds": rounds, "rank": rank, "alpha": lora.alpha,
                   "targets": list(lora.targets), "hidden_size": config.hidden_size,
                   "num_hidden_layers": config.num_hidden_layers, "vocab_size": config.vocab_size,
                   "parameters": total, "trained_parameters_full": trained["full"],
                   "trained_parameters_lora": trained["lora"], "threads": os.cpu_count(),
                   "load_average_before": load_before, "load_average_after": load_after,
                   "allocator": allocator.active()},
        "train_tokens_per_s_full": shape.rows * shape.seq / best["full"],
        "train_tokens_per_s_lora": shape.rows * shape.seq / best["lora"],
        "train_speedup_lora": best["full"] / best["lora"],
        "merge_ms": best["merge"] * 1e3,
        "decode_ms_per_step_merged": best["decode_merged"] / shape.new_tokens * 1e3,
        "decode_ms_per_step_adapters": best["decode_adapters"] / shape.new_tokens * 1e3,
        "decode_extra_ms_per_step_adapters": extra * 1e3,
        "push_break_even_decode_steps": best["merge"] / extra if extra > 0 else None,
        "prefill_ms_merged": best["prefill_merged"] * 1e3,
        "prefill_ms_adapters": best["prefill_adapters"] * 1e3,
    }
    for name, times in seconds.items():
        result[f"seconds_all_{name}"] = [round(t, 5) for t in times]
    return result


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_enum("size", "30m", sorted(SIZES), "model shapes", flag_values=values)
    flags.DEFINE_integer("rounds", 3, "alternating timed rounds (each side's best counts)", flag_values=values)
    flags.DEFINE_integer("rank", 8, "LoRA rank (alpha = 2 x rank)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.lora", __doc__, _define_flags, argv)
    result = run(args.size, args.rounds, args.rank)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        for key, value in sorted(result.items()):
            print(f"{key:36s} {value}")


if __name__ == "__main__":
    main()
