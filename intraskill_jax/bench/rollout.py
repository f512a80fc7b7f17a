"""Multi-turn rollout throughput: the embedded JAX sampler against a plain transformers loop.

    python -m intraskill_jax.bench.rollout --json

Both engines play the same simulator episodes through the same agent loop with the same weights
(our model saved as HF safetensors, loaded by transformers), greedy, same limits. The reference
is what an HF-based agent loop does: `generate` on the whole history every turn (re-prefilling
it), batched with left padding. Ours keeps each episode's cache across turns and pre-fills only
the new tokens (the prompt prefix the episodes share, once). Both are warmed up first (compilation
excluded), then run in alternating rounds; each side's best round counts. With random weights the
replies are not valid tool calls, so every episode runs its full turn budget: equal work on both
sides.

`update_tokens_per_s` times the GRPO update (`rl.train_step.grpo_step`: forward, backward, AdamW)
on the collated trajectories of the same run: one warm-up call compiles it, then the median of
`--update-repeats` calls; tokens are the batch's attention-mask tokens. `update_compact_tokens_per_s`
is the same update on the compact batch the learner trains on (the vocabulary projection on the
sampled tokens only), the two alternating call by call.

`--size smollm2` plays with SmolLM2-135M-Instruct's own tokenizer and chat template (fetched by
`intraskill fetch-model` on first use) and its whole 49,152-token vocabulary; the weights stay
random, so every episode still runs its full turn budget.

Real episodes need a policy that shops: `--model-path` loads both sides from an HF checkpoint (a
run's trained export, or anything `policy.path` takes) and `--config` plays the shop and the agent
loop of that run config (its catalog, pages, observation limits, sampler buckets and the policy
section's kernels and remat, which `--kernels` then leaves alone; `--turns` turns at most; float32
weights on both sides by default, so that greedy episodes stay equal):

    python -m intraskill_jax.bench.rollout --json --config configs/smollm2_cpu.py \
        --model-path runs/smollm2-cpu/hf/final --episodes 4 --turns 10 --new-tokens 64

`--sampler-weights bfloat16` gives our side the bfloat16 weight copies the SmolLM2 run samples with
(`rollout.sampler.weight_dtype`); the reference stays float32, so greedy episodes may part where
two tokens nearly tie: the JSON counts the turns and tokens each side played, the work compared.
`--sampler NAME=VALUE` (repeatable) sets a field of our side's `rollout.sampler` on top of the run
config's, e.g. the cache's growth (`--sampler min_cache_length=256 --sampler cache_growth=1.25`:
more cache sizes, each compiling its programs before the timed rounds, so that attention reads
fewer empty slots); the JSON's `sampler` holds the settings played. `--update-repeats 0` leaves
the update out (at 16 or more episodes it needs more memory than the rollouts). `--skill` puts the
run config's initial bank, whole, in every system prompt, as the evaluation's skill conditions see
it: the reference re-prefills it every turn; ours holds it once where the config sets
`rollout.sampler.shared_prefix_slots`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from absl import flags
from flax import nnx

from sim import flagparse
from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.world import build_world

from intraskill_jax import allocator
from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory, collate
from intraskill_jax.bench.model import KERNELS, SIZES, transformers_copy
from intraskill_jax.models import get_family
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rl.train_step import OptimConfig, grpo_step, init_train_state, make_optimizer, train_batch
from intraskill_jax.rollout.base import Completion, GenerateRequest, SamplingParams
from intraskill_jax.rollout.jax_sampler import WEIGHT_DTYPES, JaxSampler, SamplerConfig
from intraskill_jax.tokenization import IM_END, train_tokenizer


class HFGenerateEngine:
    """The reference: transformers `generate` over each request's full history, every turn."""

    collective = False

    def __init__(self, model: Any, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.weight_version = 0

    def generate(self, requests: Sequence[GenerateRequest], params: SamplingParams) -> list[Completion]:
        import torch

        width = max(len(r.input_ids) for r in requests)
        ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(requests), width), dtype=torch.long)
        for i, r in enumerate(requests):
            ids[i, width - len(r.input_ids):] = torch.tensor(list(r.input_ids))
            mask[i, width - len(r.input_ids):] = 1
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids, attention_mask=mask, max_new_tokens=params.max_new_tokens, do_sample=False,
                eos_token_id=list(params.stop_token_ids), pad_token_id=self.pad_id,
                return_dict_in_generate=True, output_scores=True)
        new = out.sequences[:, width:]
        logp = torch.stack([torch.log_softmax(s.float(), -1) for s in out.scores], 1)
        completions = []
        for i in range(len(requests)):
            toks = new[i].tolist()
            stop = next((k for k, t in enumerate(toks) if t in params.stop_token_ids), None)
            toks = toks if stop is None else toks[: stop + 1]
            lps = [float(logp[i, k, t]) for k, t in enumerate(toks)]
            completions.append(Completion(toks, lps, "stop" if stop is not None else "length", 0))
        return completions

    def release(self, session: str) -> None:
        pass


def play_episodes(engine, world, tok, specs: Sequence[EpisodeSpec], sampling, agent,
                  prefix) -> tuple[float, float, list[Trajectory]]:
    """(wall seconds, CPU seconds of this process, trajectories)."""
    t0, c0 = time.perf_counter(), time.process_time()
    trajs = run_episodes(engine, [ShopEnv(world) for _ in specs], tok, specs, sampling, agent, episode_prefix=prefix)
    return time.perf_counter() - t0, time.process_time() - c0, trajs


def update_tokens_per_s(model: nnx.Module, trajs: Sequence[Trajectory], pad_id: int, repeats: int) -> dict[str, Any]:
    """Median tokens/s of the GRPO update on `trajs`, on the dense batch and on the compact one (the
    vocabulary projection on the sampled tokens only, as the learner trains), alternating call by
    call; one warm-up call of each compiles it."""
    tx = make_optimizer(OptimConfig(learning_rate=1e-6))
    graphdef, state = init_train_state(model, tx)
    step = grpo_step(graphdef, tx, OptimConfig(learning_rate=1e-6), LossConfig(), temperature=1.0)
    collated = collate(trajs, pad_id)
    # Values do not change the work; alternating signs keep the gradient non-trivial. The rollout
    # log-probs stand in for the trainer's old log-probs (same shape, same program).
    advantages = np.where(np.arange(len(trajs)) % 2 == 0, 1.0, -1.0)
    batches = {compact: train_batch(collated, advantages=advantages, old_logprobs=collated["rollout_logprobs"],
                                    compact=compact) for compact in (False, True)}
    times = {False: [], True: []}
    for i in range(repeats + 1):
        for compact, batch in batches.items():
            t0 = time.perf_counter()
            state, metrics = step(state, batch)
            jax.block_until_ready((state, metrics))
            if i:  # the first call of each compiles
                times[compact].append(time.perf_counter() - t0)
    dense, compact = statistics.median(times[False]), statistics.median(times[True])
    tokens = int(collated["attention_mask"].sum())
    return {"update_tokens_per_s": tokens / dense, "update_seconds": dense,
            "update_compact_tokens_per_s": tokens / compact, "update_compact_seconds": compact,
            "update_batch": list(collated["tokens"].shape), "update_tokens": tokens,
            "update_trained_tokens": int(np.asarray(collated["loss_mask"]).sum()),
            "update_compact_targets": batches[True].targets.shape[1]}


def sampler_field(name: str, text: str) -> Any:
    """`text` as a value of `SamplerConfig`'s field `name`, of its type (a tuple of ints written
    with colons: `prefill_buckets=32:64:128`)."""
    fields = {f.name for f in dataclasses.fields(SamplerConfig)}
    if name not in fields:
        raise ValueError(f"{name!r} is not a field of rollout.sampler ({', '.join(sorted(fields))})")
    kind = type(getattr(SamplerConfig(), name))
    try:
        return tuple(int(x) for x in text.split(":")) if kind is tuple else kind(text)
    except ValueError:
        wanted = "ints joined by colons" if kind is tuple else f"a {kind.__name__}"
        raise ValueError(f"rollout.sampler.{name} takes {wanted}, got {text!r}") from None


def parse_sampler_settings(settings: Sequence[str]) -> dict[str, Any]:
    """['NAME=VALUE', ...] -> {NAME: value} for `SamplerConfig` fields."""
    out = {}
    for setting in settings:
        name, eq, value = setting.partition("=")
        if not eq or not value:
            raise ValueError(f"--sampler must be NAME=VALUE, got {setting!r}")
        out[name] = sampler_field(name, value)
    return out


def setup_episodes(episodes: int, turns: int, new_tokens: int, size: str, kernels: str, model_path: str | None = None,
                   config_path: str | None = None, sampler_weights: str = "auto", skill: bool = False,
                   sampler_settings: dict[str, Any] | None = None):
    """(world, tokenizer, model, sampling, agent config, episode specs, sampler config): random weights
    of `size` on the bench's small shop, or the checkpoint at `model_path` on `config_path`'s shop;
    with `skill`, the run config's initial bank, whole, in every system prompt (as the evaluation's
    skill conditions see it); `sampler_settings` set fields of the sampler config."""
    from intraskill_jax import runconfig

    run = runconfig.load_file(config_path) if config_path else runconfig.RunConfig()
    if config_path:
        world = build_world(run.sim)
        agent = dataclasses.replace(run.agent, max_turns=turns)
        sampler = dataclasses.replace(run.rollout.sampler, max_batch=episodes, weight_dtype=sampler_weights,
                                      decode_buckets=(new_tokens,))
        overrides = run.policy.model_overrides()  # its kernels and remat (the update's memory)
    else:
        world = build_world(SimConfig(catalog=CatalogConfig(num_products=2400),
                                      splits=SplitConfig(num_test=100, num_validation=50)))
        agent = AgentConfig(max_turns=turns, max_context_tokens=32768, max_observation_chars=2000)
        sampler = dataclasses.replace(sampler_config(episodes, new_tokens), weight_dtype=sampler_weights)
        overrides = KERNELS[kernels]
    sampler = dataclasses.replace(sampler, **(sampler_settings or {}))  # checked before the model loads
    if model_path:
        from intraskill_jax.models.acquire import resolve_checkpoint
        from intraskill_jax.models.params import checkpoint_family, load_pretrained
        from intraskill_jax.policy import load_tokenizer

        path = resolve_checkpoint(model_path)
        agent = dataclasses.replace(agent, tool_format=checkpoint_family(path).tool_format)
        tok = load_tokenizer(path, agent)
        model = load_pretrained(path, dtype="float32", **overrides)
    else:
        cfg = SIZES[size][0]()
        family = get_family(cfg.family)
        agent = dataclasses.replace(agent, tool_format=family.tool_format)
        if size == "smollm2":  # the checkpoint's own tokenizer and ChatML template, its whole vocabulary
            from intraskill_jax.models.acquire import fetch_model
            from intraskill_jax.policy import load_tokenizer

            agent = dataclasses.replace(agent, tool_preamble="compact")  # as configs/smollm2_cpu.py writes the tools
            tok = load_tokenizer(fetch_model("smollm2-135m-instruct"), agent)
            cfg = dataclasses.replace(cfg, pad_token_id=tok.pad_token_id, **overrides)
        else:
            texts = [world.catalog[i].title for i in range(0, len(world.catalog), 2)]
            texts += [world.catalog.tasks[i].instruction for i in range(0, len(world.catalog), 5)]
            tok = train_tokenizer(texts, vocab_size=4096, tool_format=family.tool_format)
            cfg = dataclasses.replace(cfg, vocab_size=len(tok), pad_token_id=tok.pad_token_id, **overrides)
        model = family.model_class(cfg, rngs=nnx.Rngs(0))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, stop_token_ids=(tok.convert_tokens_to_ids(IM_END),))
    specs = [EpisodeSpec(int(t)) for t in world.splits.test[:episodes]]
    if skill:
        from intraskill_jax.skills.bank import SkillBank
        from intraskill_jax.skills.masks import retry_context

        context = retry_context(SkillBank.load(run.skills.initial), run.sim.catalog.lang)
        specs = [dataclasses.replace(s, context=context) for s in specs]
    return world, tok, model, sampling, agent, specs, sampler


def sampler_config(episodes: int, new_tokens: int) -> SamplerConfig:
    """Ours as configured for this CPU: decode is bound by attention reading every cache slot, so
    the cache grows by 1.25x steps (more programs to compile, warm-up excluded); prefill chunks
    stay <= 512 (attention scores are [rows, heads, chunk, cache slots]); a turn's observation
    (~44 tokens with random weights) fills a 48 bucket."""
    return SamplerConfig(max_batch=episodes, max_length=32768, cache_growth=1.25,
                         prefill_buckets=(16, 32, 48, 64, 128, 256, 512), decode_buckets=(new_tokens,))


def run(episodes: int = 8, turns: int = 10, new_tokens: int = 32, size: str = "small", rounds: int = 2,
        update_repeats: int = 3, kernels: str = "cpu", model_path: str | None = None,
        config_path: str | None = None, sampler_weights: str = "auto", skill: bool = False,
        sampler_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    world, tok, model, sampling, agent, specs, sampler = setup_episodes(
        episodes, turns, new_tokens, size, kernels, model_path, config_path, sampler_weights, skill, sampler_settings)
    ours = JaxSampler(model, sampler)
    ref = HFGenerateEngine(transformers_copy(model).eval(), tok.pad_token_id)
    play_episodes(ours, world, tok, specs, sampling, agent, "warm")  # compiles every program the timed runs use
    play_episodes(ref, world, tok, specs[:2], dataclasses.replace(sampling, max_new_tokens=4), dataclasses.replace(agent, max_turns=1), "warm")
    load_before = os.getloadavg()[0]
    # Alternating rounds, best of each side: load from other processes only ever slows a run down.
    runs, runs_ref = [], []
    for r in range(rounds):
        for side, done, engine in (("ours", runs, ours), ("ref", runs_ref, ref)):
            done.append(play_episodes(engine, world, tok, specs, sampling, agent, f"{side}{r}"))
            # One line per round on stderr: a run cut off by a time limit still leaves its figures.
            print(json.dumps({"round": r, "side": side, "seconds": done[-1][0]}), file=sys.stderr, flush=True)
    (s, cpu, trajs), (s_ref, cpu_ref, trajs_ref) = min(runs, key=lambda x: x[0]), min(runs_ref, key=lambda x: x[0])
    load_after = os.getloadavg()[0]
    gen, gen_ref = sum(t.generated_tokens for t in trajs), sum(t.generated_tokens for t in trajs_ref)
    update = update_tokens_per_s(model, trajs, tok.pad_token_id, update_repeats) if update_repeats else {}
    return {
        "device": jax.devices()[0].device_kind,
        "config": {"size": size, "kernels": kernels, "episodes": episodes, "turns": turns, "new_tokens": new_tokens,
                   "rounds": rounds, "model_path": str(model_path or ""), "run_config": str(config_path or ""),
                   "sampler_weights": sampler_weights, "skill": skill,
                   "successes": sum(t.success for t in trajs), "successes_ref": sum(t.success for t in trajs_ref),
                   "vocab": len(tok), "hidden": model.config.hidden_size, "layers": model.config.num_hidden_layers,
                   "turns_played": sum(len(t.turns) for t in trajs),
                   "turns_played_ref": sum(len(t.turns) for t in trajs_ref),
                   "generated_tokens": gen, "generated_tokens_ref": gen_ref,
                   "final_tokens_per_episode": statistics.mean(len(t.token_ids) for t in trajs),
                   # Greedy on both sides: equal histories mean equal work (fp32 near-ties may differ).
                   "episodes_identical_to_ref": sum(a.token_ids == b.token_ids for a, b in zip(trajs, trajs_ref)),
                   "sampler_cache_slots": ours.cache_length, "shared_prefix_tokens": ours.shared_prefix_tokens,
                   # Over the warm-up and every round (`SamplerConfig.draft_tokens`).
                   "drafted_tokens_kept": ours.drafted_tokens_kept,
                   "threads": os.cpu_count(), "load_average_before": load_before, "load_average_after": load_after,
                   "allocator": allocator.active()},
        "sampler": dataclasses.asdict(sampler),
        "seconds_all": [round(x[0], 3) for x in runs],
        "seconds_all_ref": [round(x[0], 3) for x in runs_ref],
        # CPU seconds each side spent (best round): a cross-check less tied to other processes' load.
        "cpu_seconds": cpu,
        "cpu_seconds_ref": cpu_ref,
        "episodes_per_s": episodes / s,
        "episodes_per_s_ref": episodes / s_ref,
        "speedup": s_ref / s,
        "generated_tokens_per_s": gen / s,
        "generated_tokens_per_s_ref": gen_ref / s_ref,
        **update,
    }


def define_episode_flags(values: flags.FlagValues, size: str = "small") -> None:
    """The flags of the episodes a rollout benchmark plays (`setup_episodes`' arguments)."""
    flags.DEFINE_bool("json", False, "print one JSON object", flag_values=values)
    flags.DEFINE_integer("episodes", 8, "episodes per round", flag_values=values)
    flags.DEFINE_integer("turns", 10, "turns per episode", flag_values=values)
    flags.DEFINE_integer("new-tokens", 32, "tokens sampled per turn", flag_values=values)
    flags.DEFINE_enum("size", size, sorted(SIZES), "model shapes", flag_values=values)
    flags.DEFINE_enum("kernels", "cpu", sorted(KERNELS), "our kernel set (intraskill_jax.bench.model)",
                      flag_values=values)
    flags.DEFINE_integer("rounds", 2, "timed rounds per side (the best counts)", flag_values=values)
    flags.DEFINE_string("model-path", None, "load this checkpoint (any policy.path form) instead of random "
                        "weights of --size", flag_values=values)
    flags.DEFINE_string("config", None, "play the shop, agent loop and sampler buckets of this run config",
                        flag_values=values)
    flags.DEFINE_bool("skill", False, "the run config's initial skill bank, whole, in every system prompt",
                      flag_values=values)


def _define_flags(values: flags.FlagValues) -> None:
    define_episode_flags(values)
    flags.DEFINE_integer("update-repeats", 3, "timed GRPO updates (after one warm-up); 0: none", flag_values=values)
    flags.DEFINE_enum("sampler-weights", "auto", list(WEIGHT_DTYPES),
                      "our sampler's weights: the model's own (auto, as the reference's), float32, bfloat16 copies, or "
                      "bfloat16 copies where this CPU multiplies them natively, as the SmolLM2 run samples "
                      "(greedy episodes then free to part from the reference's)",
                      flag_values=values)
    flags.DEFINE_multi_string("sampler", [], "NAME=VALUE: a field of our side's rollout.sampler (repeatable)",
                              flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    if argv is None:  # run as a program: the allocator users get (intraskill_jax/allocator.py)
        allocator.ensure()
    args = flagparse.parse("python -m intraskill_jax.bench.rollout", __doc__, _define_flags, argv)
    result = run(args.episodes, args.turns, args.new_tokens, args.size, args.rounds, args.update_repeats, args.kernels,
                 args.model_path, args.config, args.sampler_weights, args.skill, parse_sampler_settings(args.sampler))
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
