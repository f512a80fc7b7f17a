"""The CPU quickstart: the whole method on a tiny Qwen3.5-architecture policy in minutes.

    intraskill train --config=configs/quickstart.py --workdir=runs/quickstart

A fresh hybrid (Gated DeltaNet + gated attention) policy and a BPE tokenizer trained on the
simulator's text are saved as an HF directory and loaded from there; SFT on oracle
demonstrations warms it up; co-evolution rounds run with the embedded JAX sampler and the
offline analyst; `intraskill eval` and `intraskill report` follow (`intraskill quickstart` runs all).
"""

import ml_collections

from intraskill_jax import presets
from intraskill_jax.runconfig import RunConfig

PRESETS = (*presets.PRESETS, "smoke")  # configs/quickstart.py:<preset>


# `configs/quickstart.py:smoke`: the whole job in a few minutes on two cores (a smaller policy and
# shop, two rounds of two steps, short episodes): CI's bare-install check and the end-to-end tests.
SMOKE = {
    "policy.init.hidden_size": 64, "policy.init.intermediate_size": 128, "policy.init.head_dim": 16,
    "policy.init.linear_key_head_dim": 16, "policy.init.linear_value_head_dim": 16,
    "policy.tokenizer_vocab_size": 1024,
    "sim.catalog.num_products": 1200, "sim.splits.num_test": 20, "sim.splits.num_validation": 20,
    "agent.max_turns": 4, "agent.max_context_tokens": 3072, "agent.max_observation_chars": 300,
    "rollout.sampler.max_batch": 16, "rollout.sampler.max_length": 6144,
    "rollout.sampler.prefill_buckets": (64, 512), "rollout.sampler.decode_buckets": (32,),
    "rollout.sampling.max_new_tokens": 32, "eval.sampling.max_new_tokens": 32,
    "warm_start.num_demos": 16, "warm_start.sft.batch_size": 8, "warm_start.sft.epochs": 1,
    "warm_start.heldout_demos": 4,
    "train.rounds": 2, "train.gate_every": 2, "train.groups_per_step": 2, "train.group_size": 2,
    "train.checkpoint_every": 1, "train.optim.micro_batch_size": 2,
    "skills.validation_tasks": 16, "skills.analysts.max_proposals": 2, "skills.gate.bootstrap_resamples": 200,
    "eval.num_tasks": 4,
}


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    """`preset`: coevolve (default), plain_grpo, fixed_skill, no_mask (configs/...py:preset), or
    smoke (the default run at the size of `SMOKE`)."""
    c = ml_collections.ConfigDict(RunConfig().to_dict())
    c.name = "quickstart"
    # One Gated DeltaNet and one gated attention layer: the hybrid at its smallest, ~1.8x faster
    # than the 3:1 four-layer stack on two CPU cores.
    c.policy.init = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=2,
                         layer_types=("linear_attention", "full_attention"), num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=32, linear_value_head_dim=32)
    c.policy.tokenizer_vocab_size = 2048
    c.policy.chat_template = "compact"
    c.policy.gdn_chunk_size = 16  # CPU: smaller DeltaNet chunks and blocked attention are ~2x faster
    c.policy.attention_block_size = 128
    c.policy.cache_block_size = 512  # CPU: a turn's prefill reads only the cache blocks in use (README, Models)
    c.policy.transpose_decode_weights = True  # CPU: the sampler reads [in, out] weight copies (README, Models)
    # Four product types of 240 near-identical items: a policy that cannot yet read the request
    # searches the right type one time in four, so its groups' loose rewards vary (see README).
    c.sim.catalog.num_products = 960
    c.sim.catalog.products_per_subcategory = 240
    c.sim.splits.num_test = 200
    c.sim.splits.num_validation = 48
    c.sim.env.max_steps = 10
    c.sim.env.page_size = 5
    c.sim.env.result_labels = "rank"
    c.sim.env.show_detail_pages = False
    c.sim.env.require_all_options = False
    c.sim.env.reward = "loose"
    c.agent.max_turns = 6
    c.agent.max_context_tokens = 2048
    c.agent.max_observation_chars = 400
    c.agent.show_affordances = False
    c.rollout.sampler.max_batch = 32
    c.rollout.sampler.max_length = 4096
    # The sessions outgrow 1,024 slots within a step; starting at 2,048 compiles each program at one
    # cache size, not two: ~55 s less compiling on two cores, the same episodes (docs/performance.md).
    c.rollout.sampler.min_cache_length = 2048
    c.rollout.sampler.prefill_buckets = (32, 64, 128, 256, 512, 1024)
    c.rollout.sampler.decode_buckets = (64,)
    # At temperature 1 the warm start garbles a third of its calls and buys in one episode of
    # five; at 0.7 it buys in half of them and scores in one of five, which gives GRPO groups
    # and the gate's pairs outcomes that differ (README, Quickstart).
    c.rollout.sampling.temperature = 0.7
    c.rollout.sampling.max_new_tokens = 48
    c.warm_start.enabled = True
    c.warm_start.num_demos = 320
    c.warm_start.sft.batch_size = 8
    c.warm_start.sft.epochs = 2
    c.warm_start.sft.optim.learning_rate = 2e-3
    c.warm_start.sft.optim.warmup_steps = 10
    c.train.rounds = 2
    c.train.gate_every = 5
    c.train.groups_per_step = 3
    c.train.group_size = 8
    c.train.checkpoint_every = 5
    c.train.optim.learning_rate = 2e-4
    c.train.optim.micro_batch_size = 8  # one group per pass; padding passes are skipped
    c.skills.initial = "skills/s0-brief"
    c.skills.validation_tasks = 48
    c.skills.max_failures_analysed = 64
    c.skills.analysts.max_proposals = 2
    c.skills.gate.bootstrap_resamples = 1000
    c.eval.num_tasks = 200
    c.eval.sampling.temperature = 0.7
    c.eval.sampling.max_new_tokens = 48
    if preset == "smoke":
        c.update_from_flattened_dict(SMOKE)
        c.name = "quickstart-smoke"
        return c
    return presets.apply(c, preset)
