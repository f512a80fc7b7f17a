"""LoRA adapters (`models/lora.py`) on the tiny Qwen models: a fresh adapter changes nothing, the
merged export computes what the adapted model does (and transformers loads it as a plain
checkpoint), adapters off give the base model, and bad targets or configs fail clearly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from safetensors.numpy import load_file

from intraskill_jax.models import ModelConfig, causal_lm_class, load_pretrained, save_pretrained, sharding
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig

CONFIGS = {"qwen3": ModelConfig.tiny_qwen3(), "qwen3_5": ModelConfig.tiny_qwen3_5()}
LORA = LoRAConfig(enabled=True, rank=4, alpha=8.0)


def _model(family: str) -> nnx.Module:
    config = CONFIGS[family]
    return causal_lm_class(config)(config, rngs=nnx.Rngs(0))


def _ids(family: str, rows: int = 2, length: int = 11) -> jax.Array:
    return jax.random.randint(jax.random.key(1), (rows, length), 0, CONFIGS[family].vocab_size)


def _trained_adapters(model: nnx.Module, seed: int = 2) -> None:
    """Random B (and A) in place, as a few updates would leave them: the adapters now matter."""
    adapters = nnx.state(model, nnx.LoRAParam)
    leaves, treedef = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    nnx.update(model, jax.tree.unflatten(treedef, [0.2 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)]))


@pytest.mark.parametrize("family", CONFIGS)
def test_fresh_adapters_give_exactly_the_base_logits(family):
    model = _model(family)
    ids = _ids(family)
    base = np.asarray(model(ids))
    lora_lib.apply_lora(model, LORA)
    assert np.array_equal(np.asarray(model(ids)), base)  # B = 0: bit for bit, not just close
    adapters = {".".join(map(str, p)): v.get_value() for p, v in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))}
    q = f"model.layers.{CONFIGS[family].layer_types.index('full_attention')}.self_attn.q_proj.lora"
    hidden = CONFIGS[family].hidden_size
    assert adapters[f"{q}.lora_a"].shape == (hidden, 4) and adapters[f"{q}.lora_b"].shape[0] == 4
    assert all(not np.any(v) for k, v in adapters.items() if k.endswith("lora_b"))
    assert all(v.dtype == jnp.float32 for v in adapters.values())
    # The targets and nothing else (not Qwen3.5's DeltaNet projections); the base keeps its HF key paths.
    assert {k.split(".")[-3] for k in adapters} == set(LORA.targets)
    assert len(adapters) == 2 * len(LORA.targets) * CONFIGS[family].layer_types.count("full_attention") + 2 * 3 * (
        CONFIGS[family].num_hidden_layers - CONFIGS[family].layer_types.count("full_attention"))
    base_keys = {".".join(map(str, p)) for p, _ in nnx.to_flat_state(lora_lib.base_params(nnx.state(model, nnx.Param)))}
    assert base_keys == {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(_model(family), nnx.Param))}


@pytest.mark.parametrize("family", CONFIGS)
def test_merged_model_computes_what_the_adapted_one_does(family):
    model = lora_lib.apply_lora(_model(family), LORA)
    _trained_adapters(model)
    ids = _ids(family)
    adapted = np.asarray(model(ids))
    merged = lora_lib.merged(model)
    assert not lora_lib.has_adapters(merged) and lora_lib.has_adapters(model)  # the adapted model is untouched
    np.testing.assert_allclose(np.asarray(merged(ids)), adapted, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(adapted - np.asarray(_model(family)(ids)))) > 1e-2  # the adapters do change it
    # Adapters off: the base model over the same arrays, bit for bit.
    off = lora_lib.without_adapters(model)
    assert np.array_equal(np.asarray(off(ids)), np.asarray(_model(family)(ids)))
    assert off.model.layers[0].mlp.up_proj.weight is model.model.layers[0].mlp.up_proj.weight


def test_merge_weight_matches_numpy():
    rng = np.random.default_rng(0)
    w, a, b = rng.normal(size=(6, 5)), rng.normal(size=(5, 3)), rng.normal(size=(3, 6))
    got = lora_lib.merge_weight(jnp.asarray(w, jnp.float32), jnp.asarray(a), jnp.asarray(b), scale=0.5)
    np.testing.assert_allclose(got, w + 0.5 * (a @ b).T, rtol=1e-5, atol=1e-5)
    # bf16 weights stay bf16 (what an export and the sampler then read), rounded once.
    got16 = lora_lib.merge_weight(jnp.asarray(w, jnp.bfloat16), jnp.asarray(a), jnp.asarray(b), scale=0.5)
    assert got16.dtype == jnp.bfloat16


@pytest.mark.parametrize("family", CONFIGS)
def test_export_writes_merged_weights_that_transformers_loads(family, tmp_path):
    from transformers import AutoModelForCausalLM

    model = lora_lib.apply_lora(_model(family), LORA)
    _trained_adapters(model)
    ids = _ids(family)
    adapted = np.asarray(model(ids))
    save_pretrained(model, tmp_path)
    keys = set(load_file(tmp_path / "model.safetensors"))
    assert not any("lora" in k for k in keys)  # a plain checkpoint: the base keys only
    assert keys == {".".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(_model(family), nnx.Param))}
    np.testing.assert_allclose(np.asarray(load_pretrained(tmp_path)(ids)), adapted, rtol=1e-5, atol=1e-5)
    hf = AutoModelForCausalLM.from_pretrained(tmp_path, torch_dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(np.array(ids), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, adapted, rtol=1e-4, atol=1e-4)


def test_adapters_are_laid_out_like_their_layer_on_a_mesh():
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=2, tensor=4))
    config = CONFIGS["qwen3"]
    model = sharding.create_sharded(lambda: causal_lm_class(config)(config, rngs=nnx.Rngs(0)), mesh)
    lora_lib.apply_lora(model, LORA, mesh=mesh)
    up = model.model.layers[0].mlp.up_proj  # weight [mlp, embed]: A [embed, r], B [r, mlp]
    assert up.weight.get_value().sharding.spec == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert up.lora.lora_a.get_value().sharding.spec == jax.sharding.PartitionSpec("fsdp", None)
    assert up.lora.lora_b.get_value().sharding.spec == jax.sharding.PartitionSpec(None, "tensor")


def test_bad_targets_and_a_second_application_are_refused():
    with pytest.raises(ValueError, match=r"\['q_prj'\].*its linear layers are \[.*'q_proj'"):
        lora_lib.apply_lora(_model("qwen3"), LoRAConfig(enabled=True, targets=("q_prj", "v_proj")))
    model = lora_lib.apply_lora(_model("qwen3"), LORA)
    with pytest.raises(ValueError, match="already has a LoRA adapter"):
        lora_lib.apply_lora(model, LORA)


@pytest.mark.parametrize("fields,words", [
    ({"rank": 0}, ["rank=0", "must be >= 1", "set rank to 1 or more"]),
    ({"alpha": 0.0}, ["alpha=0.0", "must be > 0"]),
    ({"targets": ()}, ["targets is empty", "name at least one"]),
    ({"targets": ("q_proj", "q_proj")}, ["names a layer twice"]),
    ({"targets": ("q_proj", "mlp.up_proj")}, ["'mlp.up_proj'", "attribute name of a linear layer"]),
    ({"targets": ("q_proj", "lm_head")}, ["['lm_head']", "read as a matrix", "drop it from targets"]),
])
def test_config_errors_name_the_field_and_the_fix(fields, words):
    with pytest.raises(ValueError) as err:
        LoRAConfig(enabled=True, **fields)
    assert all(w in str(err.value) for w in words), str(err.value)
    assert LoRAConfig(rank=16, alpha=32).scale == 2.0
