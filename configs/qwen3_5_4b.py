"""The original study's run: Qwen3.5-4B, G = 8, 80 GRPO steps in 4 rounds of 20, 400 test tasks,
strict reward, rollouts from SGLang servers fed with synced checkpoints.

    intraskill train --config=configs/qwen3_5_4b.py --workdir=gs://bucket/runs/qwen35 \\
        --config.policy.path=/ckpt/Qwen3.5-4B --config.rollout.url=http://127.0.0.1:30000
    launch_tpu.sh tpu --name my-v5p-16 --zone us-east5-a --config configs/qwen3_5_4b.py ...

Controls: configs/qwen3_5_4b.py:plain_grpo | :fixed_skill | :no_mask (see intraskill_jax/presets.py).
Mesh: fsdp over all devices (TPU v5p / v6e slices and 8-GPU hosts alike); set
--config.mesh.tensor=2 or 4 when activations dominate at long contexts.
"""

import ml_collections

from intraskill_jax import presets
from intraskill_jax.runconfig import RunConfig


PRESETS = presets.PRESETS  # configs/qwen3_5_4b.py:<preset>


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict(RunConfig().to_dict())
    c.name = "qwen3_5_4b"
    c.policy.path = "/path/to/Qwen3.5-4B"  # an HF checkpoint directory; override on the command line
    c.policy.dtype = "auto"  # bfloat16 on TPU/GPU
    c.policy.remat = "full"
    # The trainer's programs scan the layers (one period compiled, not 32 layers): on a v5p-8 the
    # GRPO update compiles in ~5 minutes instead of ~17 and fits (42.9 GiB per chip, unrolled 99.7).
    c.policy.scan_layers = True
    c.sim.catalog.num_products = 100_000
    c.sim.splits.num_test = 400
    c.sim.splits.num_validation = 200
    c.sim.env.reward = "strict"
    c.agent.max_turns = 20
    c.agent.max_context_tokens = 16384
    c.rollout.engine = "sglang"
    c.rollout.url = "http://127.0.0.1:30000"
    c.rollout.max_concurrent = 256
    c.rollout.sampling.temperature = 1.0
    c.rollout.sampling.max_new_tokens = 1024
    c.train.rounds = 4
    c.train.gate_every = 20
    c.train.groups_per_step = 32
    c.train.group_size = 8
    c.train.checkpoint_every = 5
    c.train.optim.learning_rate = 1e-6
    c.train.optim.warmup_steps = 5
    c.train.optim.micro_batch_size = 4
    c.skills.validation_tasks = 200
    c.skills.max_failures_analysed = 256
    c.eval.num_tasks = 400
    c.eval.sampling.max_new_tokens = 1024
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1
    return presets.apply(c, preset)
