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


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    """`preset`: coevolve (default), plain_grpo, fixed_skill or no_mask (configs/...py:preset)."""
    c = ml_collections.ConfigDict(RunConfig().to_dict())
    c.name = "quickstart"
    c.policy.init = dict(hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                         linear_key_head_dim=32, linear_value_head_dim=32)
    c.policy.tokenizer_vocab_size = 2048
    c.policy.chat_template = "compact"
    c.policy.gdn_chunk_size = 16  # CPU: smaller DeltaNet chunks and blocked attention are ~2x faster
    c.policy.attention_block_size = 128
    c.sim.catalog.num_products = 1200
    c.sim.splits.num_test = 200
    c.sim.splits.num_validation = 48
    c.sim.env.max_steps = 10
    c.sim.env.page_size = 3
    c.sim.env.result_labels = "rank"
    c.sim.env.show_detail_pages = False
    c.sim.env.require_all_options = False
    c.sim.env.reward = "loose"
    c.agent.max_turns = 8
    c.agent.max_context_tokens = 2048
    c.agent.max_observation_chars = 400
    c.agent.show_affordances = False
    c.rollout.sampler.max_batch = 32
    c.rollout.sampler.max_length = 4096
    c.rollout.sampler.prefill_buckets = (32, 64, 128, 256, 512, 1024)
    c.rollout.sampler.decode_buckets = (64,)
    c.rollout.sampling.temperature = 1.0
    c.rollout.sampling.max_new_tokens = 48
    c.warm_start.enabled = True
    c.warm_start.num_demos = 256
    c.warm_start.sft.batch_size = 8
    c.warm_start.sft.epochs = 2
    c.warm_start.sft.optim.learning_rate = 2e-3
    c.warm_start.sft.optim.warmup_steps = 10
    c.train.rounds = 2
    c.train.gate_every = 5
    c.train.groups_per_step = 4
    c.train.group_size = 8
    c.train.checkpoint_every = 5
    c.train.optim.learning_rate = 2e-4
    c.train.optim.micro_batch_size = 8  # one group per pass; padding passes are skipped
    c.skills.initial = "skills/s0-brief"
    c.skills.validation_tasks = 48
    c.skills.max_failures_analysed = 64
    c.skills.gate.bootstrap_resamples = 1000
    c.eval.num_tasks = 200
    c.eval.sampling.temperature = 1.0
    c.eval.sampling.max_new_tokens = 48
    return presets.apply(c, preset)
