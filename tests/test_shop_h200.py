"""configs/shop_h200.py, the config that learns the shop on one accelerator, loads with every
preset and runs end to end at CPU size (the same shop, rewards and stages; a tiny policy, a few
demonstrations, one round of one step, four test tasks). Its learning figure needs the
accelerator (python -m intraskill_jax.bench.learn_shop --json)."""

import json
from pathlib import Path

import pytest

from intraskill_jax import presets, runconfig

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "shop_h200.py"

CPU_SIZE = {
    "policy.init.hidden_size": 64, "policy.init.intermediate_size": 128, "policy.init.num_hidden_layers": 4,
    "policy.init.head_dim": 16, "policy.init.linear_key_head_dim": 16, "policy.init.linear_value_head_dim": 16,
    "policy.tokenizer_vocab_size": 1024, "policy.dtype": "float32",
    "sim.catalog.num_products": 1200, "sim.splits.num_test": 10, "sim.splits.num_validation": 16,
    "agent.max_turns": 8,
    "rollout.sampler.max_batch": 16, "rollout.sampler.max_length": 6144, "rollout.sampler.min_cache_length": 1024,
    "rollout.sampler.prefill_buckets": (64, 512), "rollout.sampler.decode_buckets": (32,),
    "rollout.sampling.max_new_tokens": 32, "eval.sampling.max_new_tokens": 32,
    "warm_start.num_demos": 12, "warm_start.heldout_demos": 2, "warm_start.sft.batch_size": 4,
    "warm_start.sft.epochs": 1,
    "train.rounds": 1, "train.gate_every": 1, "train.groups_per_step": 2, "train.group_size": 2,
    "train.optim.micro_batch_size": 2, "train.checkpoint_every": 1,
    "skills.validation_tasks": 16, "skills.analysts.max_proposals": 1, "skills.gate.bootstrap_resamples": 50,
    "eval.num_tasks": 4,
}


@pytest.mark.parametrize("preset", presets.PRESETS)
def test_loads_with_every_preset(preset):
    config = runconfig.load_file(f"{CONFIG}:{preset}")
    assert config.sim.env.result_labels == "rank" and config.sim.env.reward == "strict"
    assert config.sim.env.require_all_options and config.skills.initial == "skills/s0"
    assert config.policy.init["num_hidden_layers"] == 8 and config.eval.num_tasks == 200


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(900)
def test_runs_end_to_end_at_cpu_size(tmp_path):
    from intraskill_jax.coevolve import Coevolution
    from intraskill_jax.evaluate import evaluate

    config = runconfig.with_overrides(runconfig.load_file(CONFIG), CPU_SIZE)
    run = Coevolution.start(config, tmp_path, progress=False)
    try:
        final = run.run()
    finally:
        run.close()
    rows = evaluate(config, tmp_path, progress=False)
    assert sorted({r["condition"] for r in rows}) == sorted(config.eval.conditions) and len(rows) == 4 * 4
    assert all(r["reward"] == r["reward_detail"]["strict"] for r in rows)  # trained and scored on strict
    gate = json.loads((tmp_path / "gates" / "round_0.json").read_text())
    assert gate["columns"][:10] == [c.id for c in final.chunks][:10]  # the full S0, ten chunks
    assert (tmp_path / "hf" / "final" / "config.json").is_file()
