"""The LoRA benchmark runs end to end on a micro config and reports what it timed (the figures
themselves come from the bench command on a quiet machine)."""

import pytest

from intraskill_jax.bench import lora as bench
from intraskill_jax.models import ModelConfig


def test_both_sides_and_the_push_are_timed(monkeypatch: pytest.MonkeyPatch):
    micro = lambda: ModelConfig.tiny_llama(vocab_size=128, transpose_decode_weights=True)  # noqa: E731
    shape = bench.Shape(rows=2, seq=32, decode_batch=2, prompt=8, new_tokens=4)
    monkeypatch.setitem(bench.SIZES, "micro", (micro, shape))
    result = bench.run("micro", rounds=2, rank=4)
    for name in ("full", "lora", "merge", "decode_adapters", "decode_merged", "prefill_adapters", "prefill_merged"):
        rounds = result[f"seconds_all_{name}"]
        assert len(rounds) == 2 and all(r > 0 for r in rounds)
    # Each side's best round sets its figure (rounds are listed to 10 us).
    assert 2 * 32 / result["train_tokens_per_s_lora"] == pytest.approx(min(result["seconds_all_lora"]), abs=1e-5)
    assert result["train_speedup_lora"] == pytest.approx(
        result["train_tokens_per_s_lora"] / result["train_tokens_per_s_full"])
    config = result["config"]
    # Rank 4 on q/k/v/o (64 -> 64, 64 -> 32 twice, 64 -> 64) and gate/up/down (64 <-> 128), 2 layers.
    assert config["trained_parameters_lora"] == 2 * 4 * (128 + 96 + 96 + 128 + 3 * 192)
    assert config["trained_parameters_full"] == config["parameters"]
    extra = result["decode_ms_per_step_adapters"] - result["decode_ms_per_step_merged"]
    assert result["decode_extra_ms_per_step_adapters"] == pytest.approx(extra)
    if extra > 0:
        assert result["push_break_even_decode_steps"] == pytest.approx(result["merge_ms"] / extra)
    assert result["prefill_ms_adapters"] == pytest.approx(min(result["seconds_all_prefill_adapters"]) * 1e3, abs=1e-2)
    assert len(config["load_average_before"]) == 3
