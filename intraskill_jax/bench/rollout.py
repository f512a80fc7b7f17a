"""Multi-turn rollout throughput: the embedded JAX sampler against a plain transformers loop.

    python -m intraskill_jax.bench.rollout --json

Both engines play the same simulator episodes through the same agent loop with the same weights
(our model saved as HF safetensors, loaded by transformers), greedy, same limits. The reference
is what an HF-based agent loop does: `generate` on the whole history every turn (re-prefilling
it), batched with left padding. Ours keeps each episode's cache across turns and pre-fills only
the new tokens. Both are warmed up first (compilation excluded). With random weights the replies
are not valid tool calls, so every episode runs its full turn budget: equal work on both sides.
When a GRPO train step is available, `update_tokens_per_s` times one update on the collected
episodes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.world import build_world

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.bench.model import SIZES
from intraskill_jax.models import causal_lm_class
from intraskill_jax.models.params import save_pretrained
from intraskill_jax.rollout.base import Completion, GenerateRequest, SamplingParams
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from intraskill_jax.tokenization import IM_END, train_tokenizer


class HFGenerateEngine:
    """The reference: transformers `generate` over each request's full history, every turn."""

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


def _play(engine, world, tok, tasks, sampling, agent, prefix) -> tuple[float, int, int]:
    specs = [EpisodeSpec(int(t)) for t in tasks]
    t0 = time.perf_counter()
    trajs = run_episodes(engine, [ShopEnv(world) for _ in specs], tok, specs, sampling, agent, episode_prefix=prefix)
    seconds = time.perf_counter() - t0
    return seconds, sum(t.generated_tokens for t in trajs), sum(len(t.turns) for t in trajs)


def run(episodes: int = 8, turns: int = 10, new_tokens: int = 32, size: str = "small") -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM

    world = build_world(SimConfig(catalog=CatalogConfig(num_products=2400),
                                  splits=SplitConfig(num_test=100, num_validation=50)))
    texts = [world.catalog[i].title for i in range(0, len(world.catalog), 2)]
    texts += [world.catalog.tasks[i].instruction for i in range(0, len(world.catalog), 5)]
    tok = train_tokenizer(texts, vocab_size=4096)
    make_config, _ = SIZES[size]
    cfg = dataclasses.replace(make_config(), vocab_size=len(tok))
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    sampling = SamplingParams(temperature=0.0, max_new_tokens=new_tokens, stop_token_ids=(tok.convert_tokens_to_ids(IM_END),))
    agent = AgentConfig(max_turns=turns, max_context_tokens=32768, max_observation_chars=2000)
    tasks = [int(t) for t in world.splits.test[:episodes]]
    ours = JaxSampler(model, SamplerConfig(max_batch=episodes, max_length=32768,
                                           prefill_buckets=(64, 128, 256, 512, 1024, 2048), decode_buckets=(64,)))
    with tempfile.TemporaryDirectory() as d:
        save_pretrained(model, d)
        torch.set_num_threads(max(1, torch.get_num_threads()))
        ref_model = AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32).eval()
    ref = HFGenerateEngine(ref_model, tok.pad_token_id)
    _play(ours, world, tok, tasks, sampling, agent, "warm")  # compile every bucket once
    _play(ref, world, tok, tasks[:2], dataclasses.replace(sampling, max_new_tokens=4), dataclasses.replace(agent, max_turns=1), "warm")
    s, gen, n_turns = _play(ours, world, tok, tasks, sampling, agent, "ours")
    s_ref, gen_ref, _ = _play(ref, world, tok, tasks, sampling, agent, "ref")
    return {
        "device": jax.devices()[0].device_kind,
        "config": {"size": size, "episodes": episodes, "turns": turns, "new_tokens": new_tokens,
                   "vocab": len(tok), "hidden": cfg.hidden_size, "layers": cfg.num_hidden_layers,
                   "turns_played": n_turns},
        "episodes_per_s": episodes / s,
        "episodes_per_s_ref": episodes / s_ref,
        "speedup": s_ref / s,
        "generated_tokens_per_s": gen / s,
        "generated_tokens_per_s_ref": gen_ref / s_ref,
        "update_tokens_per_s": None,
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--episodes", type=int, default=8)
    p.add_argument("--turns", type=int, default=10)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--size", default="small", choices=sorted(SIZES))
    args = p.parse_args(argv)
    result = run(args.episodes, args.turns, args.new_tokens, args.size)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
