"""The shop learned from scratch on one accelerator (sized for one H200, ~18 minutes of device time).

    intraskill quickstart --config=configs/shop_h200.py --workdir=runs/shop_h200
    python -m intraskill_jax.bench.learn_shop --json      # the same run, its headline as JSON

What the CPU quickstart cannot show: a policy trained here, from random weights, that learns to
shop. A ~29M-parameter Qwen3.5 hybrid (6 Gated DeltaNet + 2 gated attention layers, head_dim 64,
so partial RoPE rotates 16 dims) and a tokenizer trained on the simulator's text; SFT on 4,000
oracle demonstrations (~18M tokens, 3 epochs); two co-evolution rounds of 8 GRPO steps with the
full S0 skill; the four conditions on 200 test tasks. Targets: the warm start succeeds on >= 10%
of the test tasks, the trained policy on >= the warm start + 15 points with a paired 95% interval
above zero. Run once on the lent H200 (2026-12-04, docs/performance.md), cut at step 14 of 16:
targets not met, the warm start does not learn to copy the request into its search (held-out
agreement 0.002) and GRPO's success stays at 0-0.4%.

The shop is the real one with two simplifications that keep the copying a from-scratch model
must learn to what a few million tokens teach: products are clicked by their rank on the results
page (`sim.env.result_labels='rank'`) instead of a 12-digit id, and there are no detail pages.
Everything else is the study's: strict reward, every option axis chosen before `buy now`, 50
product types of 120 near-identical items each.
"""

import ml_collections

from intraskill_jax import presets
from intraskill_jax.runconfig import RunConfig


PRESETS = presets.PRESETS  # configs/shop_h200.py:<preset>


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    """`preset`: coevolve (default), plain_grpo, fixed_skill or no_mask (configs/shop_h200.py:preset)."""
    c = ml_collections.ConfigDict(RunConfig().to_dict())
    c.name = "shop_h200"
    c.policy.init = dict(hidden_size=512, intermediate_size=1536, num_hidden_layers=8, num_attention_heads=8,
                         num_key_value_heads=2, head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
                         linear_key_head_dim=64, linear_value_head_dim=64, tie_word_embeddings=True)
    c.policy.tokenizer_vocab_size = 4096
    c.policy.chat_template = "compact"
    c.policy.dtype = "auto"  # bfloat16 on GPU/TPU
    c.sim.catalog.num_products = 6000
    c.sim.catalog.persona_fraction = 0.0
    c.sim.splits.num_test = 200
    c.sim.splits.num_validation = 100
    c.sim.env.page_size = 5
    c.sim.env.max_steps = 15
    c.sim.env.result_labels = "rank"
    c.sim.env.show_detail_pages = False
    c.sim.env.reward = "strict"
    c.agent.max_turns = 10
    c.agent.max_context_tokens = 4096
    c.agent.max_observation_chars = 800
    c.agent.show_affordances = False
    c.rollout.sampler.max_batch = 256
    c.rollout.sampler.max_length = 8192
    c.rollout.sampler.min_cache_length = 2048
    c.rollout.sampler.prefill_buckets = (64, 256, 1024, 2048)
    c.rollout.sampler.decode_buckets = (64,)
    c.rollout.sampling.temperature = 1.0
    c.rollout.sampling.max_new_tokens = 64
    c.warm_start.enabled = True
    c.warm_start.num_demos = 4000
    c.warm_start.heldout_demos = 64
    c.warm_start.sft.batch_size = 32
    c.warm_start.sft.epochs = 3
    c.warm_start.sft.optim.learning_rate = 1e-3
    c.warm_start.sft.optim.warmup_steps = 50
    c.train.rounds = 2
    c.train.gate_every = 8
    c.train.groups_per_step = 16
    c.train.group_size = 8
    c.train.checkpoint_every = 8
    c.train.optim.learning_rate = 2e-5
    c.train.optim.micro_batch_size = 32
    c.skills.validation_tasks = 100
    c.skills.max_failures_analysed = 128
    c.eval.num_tasks = 200
    c.eval.sampling.temperature = 1.0
    c.eval.sampling.max_new_tokens = 64
    return presets.apply(c, preset)
