"""The update benchmark runs end to end on a micro Llama: every side times the same mixed-length
batch, the grouped side computes fewer tokens than the padded one, and the transformers side is the
same update (the same first loss; LoRA adapters alone trained, checkpointed layers). The figures
themselves come from the bench command on a quiet machine."""

import sys

import pytest

from intraskill_jax.bench import update as bench
from intraskill_jax.models import ModelConfig


def _micro(remat: str) -> ModelConfig:
    return ModelConfig.smollm2_135m(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                                    num_key_value_heads=1, head_dim=32, vocab_size=256, dtype="float32",
                                    param_dtype="float32", remat=remat, scan_layers=True)


def test_padded_grouped_and_transformers_updates_are_timed_on_the_same_batch(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    result = bench.run("micro", rows=5, shortest=100, longest=300, micro=2, rounds=1)
    # Rows of 300..100 tokens collate to 384; micro-batches (300, 250), (200, 150) and (100, an empty
    # padding row) run at 384, 256 and 128.
    assert result["width"] == 384 and result["tokens"] == 300 + 250 + 200 + 150 + 100
    grouped = 2 * 384 + 2 * 256 + 2 * 128
    assert result["computed_tokens"] == {"padded": 6 * 384, "grouped": grouped, "transformers": grouped}
    assert set(result["seconds"]) == {"padded", "grouped", "transformers"}
    assert all(len(t) == 1 for t in result["seconds_all"].values())
    assert result["speedup_grouped"] == pytest.approx(result["seconds"]["padded"] / result["seconds"]["grouped"])
    assert result["speedup_vs_transformers"] == pytest.approx(
        result["seconds"]["transformers"] / result["seconds"]["grouped"])
    # The same weights, micro-batches and loss on both sides: the adapters start at zero, so the first
    # update's loss is the base model's, computed by transformers' own Llama.
    first = result["first_loss"]
    assert first["grouped"] != 0 and first["padded"] == pytest.approx(first["grouped"], rel=1e-6)
    assert first["transformers"] == pytest.approx(first["grouped"], rel=1e-4, abs=1e-7)


def test_the_transformers_update_trains_lora_adapters_on_checkpointed_layers(monkeypatch: pytest.MonkeyPatch):
    import torch
    import transformers

    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    made, models = [], []
    real_adamw, real_load = torch.optim.AdamW, transformers.AutoModelForCausalLM.from_pretrained
    monkeypatch.setattr(torch.optim, "AdamW",
                        lambda params, **kw: made.append(list(params)) or real_adamw(made[-1], **kw))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained",
                        lambda *a, **kw: models.append(real_load(*a, **kw)) or models[-1])
    bench.run("micro", rows=4, shortest=100, longest=300, micro=2, rounds=1, reference=True)
    (params,), (model,) = made, models
    checkpointed = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.x's name
    assert (model.is_gradient_checkpointing if checkpointed is None else checkpointed) and model.training
    # Two adapter matrices for each of the 7 default targets in each of the 2 layers; nothing else trains.
    assert len(params) == 2 * 7 * 2 and {tuple(p.shape) for p in params} >= {(16, 64), (64, 16)}
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)


def test_each_further_remat_policy_is_a_grouped_peer_with_its_temporary_memory(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    result = bench.run("micro", rows=4, shortest=100, longest=300, micro=2, rounds=1, remat=("full", "none"),
                       reference=False)
    assert set(result["seconds"]) == {"padded", "grouped", "grouped:none"}
    assert result["computed_tokens"]["grouped:none"] == result["computed_tokens"]["grouped"]
    assert result["speedup_remat"]["none"] == pytest.approx(
        result["seconds"]["grouped"] / result["seconds"]["grouped:none"])
    # Without remat the backward keeps every layer's activations: more temporaries than full remat.
    assert result["temp_gib"]["none"] > result["temp_gib"]["full"] > 0


def test_without_torch_the_reference_side_says_what_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(bench.SIZES, "micro", _micro)
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` raises ImportError
    with pytest.raises(SystemExit, match=r"needs torch and transformers .*--noreference"):
        bench.run("micro", rows=4, shortest=100, longest=300, micro=2, rounds=1)
