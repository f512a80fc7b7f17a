"""HF safetensors in/out (`models/params.py`) against transformers' own save/load.

Checkpoints are written by transformers' `save_pretrained` from tiny random models (every norm
weight, A_log and dt_bias randomised, see `hf_reference.build_hf_model`) in three layouts:
multimodal Qwen3.5 (`model.language_model.*`, a tiny vision tower and an injected `mtp.*` tensor,
split into many files), text-only Qwen3.5 and tied Qwen3 dense. Logit parity of the model code
itself is `test_qwen3_5.py`'s job; here a mapping or cast error would show as a logit mismatch.
"""

from __future__ import annotations

import copy
import json
import logging
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file, save_file

from intraskill_jax.models import ModelConfig, hf_config, load_pretrained
from intraskill_jax.models import params as params_lib
from tests.models.hf_reference import build_hf_model, hf_logits, left_padded, rel_err

LAYOUTS = ("multimodal", "text", "qwen3")
SHARD = "30KB"  # small enough that every layout is split over several files


def _config(layout: str) -> ModelConfig:
    if layout == "qwen3":
        return ModelConfig.tiny_qwen3()
    return ModelConfig.tiny_qwen3_5(tie_word_embeddings=False)


def _multimodal(text_model: torch.nn.Module, config: ModelConfig) -> torch.nn.Module:
    """A Qwen3_5ForConditionalGeneration whose text half is `text_model`'s weights."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    text = hf_config(config)
    text.pop("architectures")
    vision = {
        "depth": 1,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": config.hidden_size,
        "patch_size": 4,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "num_position_embeddings": 16,
    }
    mm = Qwen3_5ForConditionalGeneration(
        Qwen3_5Config(
            text_config=text, vision_config=vision, tie_word_embeddings=config.tie_word_embeddings
        )
    )
    mm.model.language_model.load_state_dict(text_model.model.state_dict())
    mm.lm_head.load_state_dict(text_model.lm_head.state_dict())
    return mm.eval()


def _add_mtp_tensor(directory: Path) -> None:
    """Official checkpoints carry an MTP head that transformers does not build; fake one."""
    save_file(
        {"mtp.fc.weight": np.ones((4, 4), np.float32)},
        directory / "mtp.safetensors",
        metadata={"format": "pt"},
    )
    index_path = directory / params_lib.INDEX_FILE
    index = json.loads(index_path.read_text())
    index["weight_map"]["mtp.fc.weight"] = "mtp.safetensors"
    index_path.write_text(json.dumps(index))


@pytest.fixture(scope="module")
def checkpoints(
    tmp_path_factory,
) -> dict[tuple[str, str], tuple[Path, torch.nn.Module, ModelConfig]]:
    """(layout, dtype) -> (checkpoint dir, fp32 torch reference of the saved weights, config)."""
    out = {}
    for layout in LAYOUTS:
        config = _config(layout)
        ref = build_hf_model(config, seed=3)
        saved = _multimodal(ref, config) if layout == "multimodal" else ref
        for dtype in ("float32", "bfloat16"):
            directory = tmp_path_factory.mktemp(f"{layout}_{dtype}")
            copy.deepcopy(saved).to(getattr(torch, dtype)).save_pretrained(
                directory, max_shard_size=SHARD
            )
            if layout == "multimodal":
                _add_mtp_tensor(directory)
            # The reference sees exactly the (possibly rounded) weights that were written.
            exact = build_hf_model(config, seed=3)
            exact.load_state_dict(
                {k: v.to(getattr(torch, dtype)).float() for k, v in ref.state_dict().items()}
            )
            out[layout, dtype] = directory, exact.eval(), config
    return out


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_load_matches_transformers(checkpoints, layout, dtype, caplog):
    directory, ref, config = checkpoints[layout, dtype]
    assert len(list(directory.glob("*.safetensors"))) > 2
    with caplog.at_level(logging.INFO, logger=params_lib.__name__):
        model = load_pretrained(directory, dtype="float32")  # the package entry point
    if layout == "multimodal":
        assert "Skipped" in caplog.text and "model.visual" in caplog.text
    ids, mask = left_padded(np.random.default_rng(0), 2, 70, config.vocab_size, pads=[0, 5])
    ours = np.asarray(nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, mask))
    assert ours.shape == (2, 70, config.vocab_size)
    assert rel_err(ours, hf_logits(ref, ids, mask), mask) < 1e-4


def test_bf16_checkpoint_loads_bit_exact_into_bf16_params(checkpoints):
    directory, ref, _ = checkpoints["text", "bfloat16"]
    model = params_lib.load_pretrained(directory, dtype="bfloat16")
    expected = {k: v.to(torch.bfloat16).float().numpy() for k, v in ref.state_dict().items()}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        value = var.get_value()
        assert value.dtype == jnp.bfloat16
        np.testing.assert_array_equal(
            np.asarray(value, np.float32), expected[".".join(map(str, path))]
        )


@pytest.mark.parametrize("layout", LAYOUTS)
def test_export_round_trips_through_transformers(checkpoints, layout, tmp_path):
    from transformers import AutoModelForCausalLM, Qwen3_5ForConditionalGeneration

    source, _, _ = checkpoints[layout, "bfloat16"]
    model = params_lib.load_pretrained(source, dtype="bfloat16")
    out = params_lib.save_pretrained(
        model,
        tmp_path / "export",
        max_shard_size=20_000,
        hf_config=params_lib.read_hf_config(source),
        source=source,
    )
    assert (out / params_lib.INDEX_FILE).exists()
    # Everything transformers wrote, vision tower and MTP included, comes back bit for bit.
    original = {k: r for k, r in params_lib.read_checkpoint(source).items()}
    exported = params_lib.read_checkpoint(out)
    assert set(exported) == set(original)
    for key, record in original.items():
        assert exported[key].dtype == record.dtype, key
        np.testing.assert_array_equal(exported[key].view(), record.view(), err_msg=key)
    cls = Qwen3_5ForConditionalGeneration if layout == "multimodal" else AutoModelForCausalLM
    loaded = cls.from_pretrained(out)
    assert next(loaded.parameters()).dtype == torch.bfloat16
    reference = cls.from_pretrained(source)
    theirs = reference.state_dict()
    for key, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, theirs[key]), key


def test_export_text_only_by_default_loads_in_transformers(checkpoints, tmp_path):
    from transformers import AutoModelForCausalLM

    source, ref, _ = checkpoints["multimodal", "float32"]
    model = params_lib.load_pretrained(source, dtype="float32")
    out = params_lib.save_pretrained(model, tmp_path / "text")
    assert (out / params_lib.SINGLE_FILE).exists() and not (out / params_lib.INDEX_FILE).exists()
    loaded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    expected = ref.state_dict()
    assert set(loaded) == set(expected)
    for key, tensor in loaded.items():
        assert torch.equal(tensor, expected[key]), key


# --------------------------------------------------------------------------- errors
@pytest.fixture
def single_file(checkpoints, tmp_path) -> Path:
    """A writable one-file copy of the text checkpoint."""
    source, _, _ = checkpoints["text", "float32"]
    tensors = {k: np.asarray(r.view()) for k, r in params_lib.read_checkpoint(source).items()}
    save_file(tensors, tmp_path / params_lib.SINGLE_FILE, metadata={"format": "pt"})
    shutil.copy(source / "config.json", tmp_path / "config.json")
    return tmp_path


def _rewrite(directory: Path, edit) -> None:
    path = directory / params_lib.SINGLE_FILE
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def test_missing_key_is_named(single_file):
    _rewrite(single_file, lambda t: t.pop("model.layers.1.linear_attn.A_log"))
    with pytest.raises(
        params_lib.CheckpointError, match=r"Missing: \['model.layers.1.linear_attn.A_log'\]"
    ):
        params_lib.load_pretrained(single_file)


def test_unexpected_key_is_named(single_file):
    _rewrite(
        single_file, lambda t: t.update({"model.layers.0.extra.weight": np.zeros(2, np.float32)})
    )
    with pytest.raises(params_lib.CheckpointError, match=r"model\.layers\.0\.extra\.weight"):
        params_lib.load_pretrained(single_file)


def test_shape_mismatch_names_key_and_file(single_file):
    _rewrite(single_file, lambda t: t.update({"model.norm.weight": np.zeros(3, np.float32)}))
    with pytest.raises(
        params_lib.CheckpointError,
        match=r"model\.safetensors: model\.norm\.weight has shape \(3,\)",
    ):
        params_lib.load_pretrained(single_file)


def test_truncated_file_is_reported(single_file):
    path = single_file / params_lib.SINGLE_FILE
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(params_lib.CheckpointError, match=r"model\.safetensors.*truncated"):
        params_lib.load_pretrained(single_file)


def test_garbage_file_is_reported(single_file):
    (single_file / params_lib.SINGLE_FILE).write_bytes(
        b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!"
    )
    with pytest.raises(params_lib.CheckpointError, match="corrupt safetensors header"):
        params_lib.load_pretrained(single_file)


def test_missing_shard_is_reported(checkpoints, tmp_path):
    source, _, _ = checkpoints["qwen3", "float32"]
    copy = shutil.copytree(source, tmp_path / "ckpt")
    victim = sorted(copy.glob("model-*.safetensors"))[1]
    victim.unlink()
    with pytest.raises(params_lib.CheckpointError, match=f"lists {victim.name}, which is missing"):
        params_lib.load_pretrained(copy)


def test_directory_without_weights_is_reported(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(hf_config(ModelConfig.tiny_qwen3())))
    with pytest.raises(params_lib.CheckpointError, match="neither model.safetensors nor"):
        params_lib.load_pretrained(tmp_path)
