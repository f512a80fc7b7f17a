"""Our sampler's weights in float32 against bfloat16 copies, on this machine: which plays faster.

    python -m intraskill_jax.bench.sampler_weights --json --config configs/smollm2_cpu.py \
        --model-path runs/smollm2-cpu/sft/hf --episodes 16 --turns 10

Both samplers play the same episodes through the agent loop of `bench.rollout` (greedy, the same
shop, tasks and limits; random weights of `--size`, or `--model-path` on `--config`'s shop), each
warmed up first, then in alternating rounds; each side's best round counts. XLA:CPU multiplies
bfloat16 in hardware only with AVX512-BF16 or AMX; elsewhere it converts the copies, and they have
been slower (`rollout.sampler.weight_dtype = "bfloat16_if_native"` picks by that: `native_bfloat16`).
The JSON carries `native_bfloat16` (that verdict) beside the measured ratio, so one run says
whether the choice is right here; the two sides' turns and tokens show that they did the same work
(greedy bfloat16 episodes may part from float32's where two tokens nearly tie).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.bench.rollout import define_episode_flags, play_episodes, setup_episodes
from intraskill_jax.rollout.jax_sampler import JaxSampler, native_bfloat16_products

WEIGHTS = ("float32", "bfloat16")


def run(episodes: int = 8, turns: int = 10, new_tokens: int = 32, size: str = "smollm2", rounds: int = 2,
        kernels: str = "cpu", model_path: str | None = None, config_path: str | None = None) -> dict[str, Any]:
    world, tok, model, sampling, agent, tasks, sampler = setup_episodes(episodes, turns, new_tokens, size, kernels,
                                                                        model_path, config_path)
    engines = {w: JaxSampler(model, dataclasses.replace(sampler, weight_dtype=w)) for w in WEIGHTS}
    for w, engine in engines.items():
        play_episodes(engine, world, tok, tasks, sampling, agent, f"warm-{w}")  # compiles every program
    load_before = os.getloadavg()[0]
    rounds_played: dict[str, list[dict[str, Any]]] = {w: [] for w in WEIGHTS}
    for r in range(rounds):  # alternating: load from other processes only ever slows a round down
        for w, engine in engines.items():
            seconds, cpu, trajs = play_episodes(engine, world, tok, tasks, sampling, agent, f"{w}{r}")
            rounds_played[w].append({"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 2),
                                     "turns": sum(len(t.turns) for t in trajs),
                                     "generated_tokens": sum(t.generated_tokens for t in trajs),
                                     "successes": sum(t.success for t in trajs)})
    best = {w: min(rounds_played[w], key=lambda x: x["seconds"]) for w in WEIGHTS}
    return {
        "config": {"size": size, "kernels": kernels, "episodes": episodes, "turns": turns, "new_tokens": new_tokens,
                   "rounds": rounds, "model_path": str(model_path or ""), "run_config": str(config_path or ""),
                   "threads": os.cpu_count(), "load_average_before": load_before,
                   "load_average_after": os.getloadavg()[0], "allocator": allocator.active()},
        "native_bfloat16": native_bfloat16_products(),
        "rounds": rounds_played,
        "best": best,
        # > 1: the bfloat16 copies play the episodes faster here.
        "bfloat16_speedup": best["float32"]["seconds"] / best["bfloat16"]["seconds"],
    }


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.sampler_weights", __doc__,
                           lambda values: define_episode_flags(values, size="smollm2"), argv)
    result = run(args.episodes, args.turns, args.new_tokens, args.size, args.rounds, args.kernels, args.model_path,
                 args.config)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
