"""Can a tiny policy learn to copy an id from its context? A synthetic SFT probe, one JSON line.

Every shopping success copies a product id from a results page into a click. This probe trains
small models, through the same SFT path as the warm start, on the bare skill: a list of five
`1dddd [SEP] words` entries, then `click:` and the first entry's id. It reports, on held-out
lists, the chance of sampling the whole id (temperature 1) and the final loss, per model variant:

    python3 -m intraskill_jax.bench.copy_probe --json --updates 1000 --variants hybrid,qwen3

Variants: `hybrid` (the quickstart layout: 3 DeltaNet + 1 attention, partial RoPE 0.25),
`attention` (4 gated-attention layers, partial RoPE 0.25), `attention_full_rope` (the same with
RoPE on every dimension), `qwen3` (2 dense layers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import numpy as np
from absl import flags

from sim import flagparse

WORDS = ("pillow", "towel", "blue", "red", "cotton", "silk", "luxury", "kids", "soft", "warm", "mat", "lamp")
WIDTH = dict(hidden_size=128, intermediate_size=384, num_attention_heads=4, num_key_value_heads=2, head_dim=32)
VARIANTS = ("hybrid", "attention", "attention_full_rope", "qwen3")


def model_config(variant: str, vocab_size: int):
    from intraskill_jax.models import ModelConfig

    if variant == "qwen3":
        return ModelConfig.tiny_qwen3(vocab_size=vocab_size, **WIDTH)
    linear = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32)
    extra: dict = {}
    if variant in ("attention", "attention_full_rope"):
        extra["layer_types"] = ("full_attention",) * 4
    if variant == "attention_full_rope":
        extra["partial_rotary_factor"] = 1.0
    return ModelConfig.tiny_qwen3_5(vocab_size=vocab_size, gdn_chunk_size=16, **WIDTH, **linear, **extra)


def examples(tokenizer, n: int, seed: int):
    from intraskill_jax.agent.trajectory import Trajectory

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        ids = ["1" + "".join(map(str, rng.integers(0, 10, 4))) for _ in range(5)]
        page = " [SEP] ".join(f"{d} [SEP] {' '.join(rng.choice(WORDS, 4))}" for d in ids)
        prompt = tokenizer.encode(f"Results: {page}\nclick:\n", add_special_tokens=False)
        answer = tokenizer.encode(ids[0] + "\n", add_special_tokens=False)
        tokens = prompt + answer
        out.append(Trajectory(episode_id=f"copy-{seed}-{i}", task_id=i, group=0, skill_mask=(), token_ids=tokens,
                              loss_mask=[0] * len(prompt) + [1] * len(answer), logprobs=[0.0] * len(tokens),
                              prompt_length=len(prompt)))
    return out


def probe(variant: str, updates: int, batch_size: int, learning_rate: float) -> dict:
    from flax import nnx

    from intraskill_jax.models import causal_lm_class
    from intraskill_jax.rl.sft import SFTConfig, reply_logprobs, run_sft
    from intraskill_jax.rl.train_step import OptimConfig
    from intraskill_jax.tokenization import train_tokenizer

    rng = np.random.default_rng(0)
    corpus = [" ".join(rng.choice(WORDS, 8)) + " [SEP] click: 0123456789" for _ in range(200)]
    tokenizer = train_tokenizer(corpus, vocab_size=400)
    config = model_config(variant, len(tokenizer))
    model = causal_lm_class(config)(config, rngs=nnx.Rngs(0))
    sft = SFTConfig(optim=OptimConfig(learning_rate=learning_rate, warmup_steps=10), batch_size=batch_size,
                    length_multiple=64)
    start = time.perf_counter()
    result = run_sft(model, examples(tokenizer, updates * batch_size, seed=1), sft,
                     pad_id=tokenizer.pad_token_id, progress=False)
    seconds = time.perf_counter() - start
    held_out = reply_logprobs(model, examples(tokenizer, 64, seed=2), pad_id=tokenizer.pad_token_id)
    return {"variant": variant, "updates": updates, "batch_size": batch_size, "seconds": round(seconds, 1),
            "final_loss": round(float(np.mean([r["train/sft_loss"] for r in result.history[-20:]])), 4),
            "copy_chance": float(np.mean([np.exp(r[0]) for r in held_out]))}


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_list("variants", ["hybrid", "qwen3"], f"model variants, comma-separated ({', '.join(VARIANTS)})",
                      flag_values=values)
    flags.register_validator("variants", lambda vs: bool(vs) and set(vs) <= set(VARIANTS),
                             f"one or more of {', '.join(VARIANTS)}", flag_values=values)
    flags.DEFINE_integer("updates", 1000, "SFT updates per variant", flag_values=values)
    flags.DEFINE_integer("batch-size", 8, "lists per update", flag_values=values)
    flags.DEFINE_float("learning-rate", 2e-3, "SFT learning rate", flag_values=values)
    flags.DEFINE_bool("json", False, "one JSON object (the default output too)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    args = flagparse.parse("python -m intraskill_jax.bench.copy_probe", __doc__, _define_flags, argv)
    rows = [probe(v, args.updates, args.batch_size, args.learning_rate) for v in args.variants]
    print(json.dumps({"bench": "copy_probe", "results": rows}))


if __name__ == "__main__":
    main()
