"""The update benchmark runs end to end on a micro Llama: both sides time the same mixed-length
batch, and the grouped side computes fewer tokens than the padded one (the figures themselves come
from the bench command on a quiet machine)."""

import pytest

from intraskill_jax.bench import update as bench
from intraskill_jax.models import ModelConfig


def _micro(remat: str) -> ModelConfig:
    return ModelConfig.smollm2_135m(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=32, vocab_size=256, dtype="float32",
                                    param_dtype="float32", remat=remat, scan_layers=True)


def test_padded_and_grouped_updates_are_timed_on_the_same_batch(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    result = bench.run("micro", rows=4, shortest=100, longest=300, micro=2, rounds=1)
    # Rows of 300..100 tokens collate to 384; micro-batches (300, 233) and (166, 100) run at 384 and 256.
    assert result["width"] == 384 and result["tokens"] == 300 + 233 + 166 + 100
    assert result["computed_tokens"] == {"padded": 4 * 384, "grouped": 2 * 384 + 2 * 256}
    assert set(result["seconds"]) == {"padded", "grouped"} and all(len(t) == 1 for t in result["seconds_all"].values())
    assert result["speedup_grouped"] == pytest.approx(result["seconds"]["padded"] / result["seconds"]["grouped"])


def test_each_further_remat_policy_is_a_grouped_peer_with_its_temporary_memory(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    result = bench.run("micro", rows=4, shortest=100, longest=300, micro=2, rounds=1, remat=("full", "none"))
    assert set(result["seconds"]) == {"padded", "grouped", "grouped:none"}
    assert result["computed_tokens"]["grouped:none"] == result["computed_tokens"]["grouped"]
    assert result["speedup_remat"]["none"] == pytest.approx(
        result["seconds"]["grouped"] / result["seconds"]["grouped:none"])
    # Without remat the backward keeps every layer's activations: more temporaries than full remat.
    assert result["temp_gib"]["none"] > result["temp_gib"]["full"] > 0
