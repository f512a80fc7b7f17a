"""Two settings of our sampler on the same episodes, on this machine: which plays them faster.

    python -m intraskill_jax.bench.sampler --json --config configs/smollm2_cpu.py \
        --model-path runs/smollm2-cpu/sft/hf --episodes 16 --turns 10 --new-tokens 64
    python -m intraskill_jax.bench.sampler --json --config configs/smollm2_cpu.py --skill \
        --setting shared_prefix_slots=0,1024 --episodes 32 --turns 8 --new-tokens 64

`--setting NAME=A,B` names a field of `rollout.sampler` (`SamplerConfig`) and its two values; the
default, `weight_dtype=float32,bfloat16`, asks whether bfloat16 weight copies pay here: XLA:CPU
multiplies bfloat16 in hardware only with AVX512-BF16 or AMX, elsewhere it converts the copies, and
they have been slower (`weight_dtype = "bfloat16_if_native"` picks by that: the JSON's
`native_bfloat16`). Both samplers play the same episodes through the agent loop of `bench.rollout`
(greedy, the same shop, tasks and limits; random weights of `--size`, or `--model-path` on
`--config`'s shop), with `--skill` the run's initial skill bank, whole, in every system prompt (as
the evaluation's skill conditions see it); each sampler is warmed up first, then they alternate
round by round and each one's best round counts. The two sides' turns and tokens show that they did
the same work (greedy episodes may part where two tokens nearly tie and the summation order
differs, as bfloat16 products do). With `--temperature` the episodes are sampled, as GRPO's and the
evaluation's are (`rollout.sampling`, `eval.sampling`): each side then plays episodes of its own,
and `speedup_per_token` compares the seconds per generated token of the two best rounds. Each round
reports the drafted tokens its sampler kept (`draft_tokens`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from absl import flags
from sim import flagparse

from intraskill_jax import allocator
from intraskill_jax.bench.rollout import define_episode_flags, play_episodes, sampler_field, setup_episodes
from intraskill_jax.rollout.jax_sampler import JaxSampler, native_bfloat16_products

DEFAULT_SETTING = "weight_dtype=float32,bfloat16"


def parse_setting(setting: str) -> tuple[str, list[Any]]:
    """'NAME=A,B' -> (NAME, [A, B]) with the values of the `SamplerConfig` field's type."""
    name, _, values = setting.partition("=")
    parts = values.split(",")
    if len(parts) != 2 or not all(parts):
        raise ValueError(f"--setting must be NAME=A,B with NAME a field of rollout.sampler, got {setting!r}")
    return name, [sampler_field(name, p) for p in parts]


def run(episodes: int = 8, turns: int = 10, new_tokens: int = 32, size: str = "smollm2", rounds: int = 2,
        kernels: str = "cpu", model_path: str | None = None, config_path: str | None = None,
        setting: str = DEFAULT_SETTING, skill: bool = False, temperature: float = 0.0) -> dict[str, Any]:
    name, values = parse_setting(setting)
    world, tok, model, sampling, agent, specs, sampler = setup_episodes(episodes, turns, new_tokens, size, kernels,
                                                                        model_path, config_path, skill=skill)
    sampling = dataclasses.replace(sampling, temperature=temperature)
    labels = [f"{name}={v}" for v in values]
    engines = {label: JaxSampler(model, dataclasses.replace(sampler, **{name: v})) for label, v in zip(labels, values)}
    for label, engine in engines.items():
        play_episodes(engine, world, tok, specs, sampling, agent, f"warm-{label}")  # compiles every program
    load_before = os.getloadavg()[0]
    rounds_played: dict[str, list[dict[str, Any]]] = {label: [] for label in labels}
    for r in range(rounds):  # alternating: load from other processes only ever slows a round down
        for label, engine in engines.items():
            kept = engine.drafted_tokens_kept
            seconds, cpu, trajs = play_episodes(engine, world, tok, specs, sampling, agent, f"{label}/{r}")
            rounds_played[label].append({"seconds": round(seconds, 3), "cpu_seconds": round(cpu, 2),
                                         "turns": sum(len(t.turns) for t in trajs),
                                         "generated_tokens": sum(t.generated_tokens for t in trajs),
                                         "successes": sum(t.success for t in trajs),
                                         "drafted_tokens_kept": engine.drafted_tokens_kept - kept,
                                         "tokens": [t.token_ids for t in trajs]})
    best = {label: min(rounds_played[label], key=lambda x: x["seconds"]) for label in labels}
    first, second = labels
    same = sum(a == b for a, b in zip(best[first].pop("tokens"), best[second].pop("tokens")))
    for played in rounds_played.values():
        for round_ in played:
            round_.pop("tokens", None)
    return {
        "config": {"size": size, "kernels": kernels, "episodes": episodes, "turns": turns, "new_tokens": new_tokens,
                   "rounds": rounds, "model_path": str(model_path or ""), "run_config": str(config_path or ""),
                   "skill": skill, "setting": setting, "temperature": temperature, "threads": os.cpu_count(),
                   "load_average_before": load_before, "load_average_after": os.getloadavg()[0],
                   "allocator": allocator.active()},
        "native_bfloat16": native_bfloat16_products(),
        "rounds": rounds_played,
        "best": best,
        "identical_episodes": same,  # of `episodes`, token for token, between the two best rounds
        # > 1: the second setting plays the episodes faster here.
        "speedup": best[first]["seconds"] / best[second]["seconds"],
        # The same, per generated token: sampled episodes differ between the sides.
        "speedup_per_token": (best[first]["seconds"] / best[first]["generated_tokens"])
        / (best[second]["seconds"] / best[second]["generated_tokens"]),
    }


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()

    def define(values: flags.FlagValues) -> None:
        define_episode_flags(values, size="smollm2")
        flags.DEFINE_string("setting", DEFAULT_SETTING, "NAME=A,B: a rollout.sampler field and its two values",
                            flag_values=values)
        flags.DEFINE_float("temperature", 0.0, "sample the episodes at this temperature (0: greedy)",
                           flag_values=values)

    args = flagparse.parse("python -m intraskill_jax.bench.sampler", __doc__, define, argv)
    result = run(args.episodes, args.turns, args.new_tokens, args.size, args.rounds, args.kernels, args.model_path,
                 args.config, args.setting, args.skill, args.temperature)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
