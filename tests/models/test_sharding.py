"""Mesh, logical-axis rules and sharded models on 8 fake CPU devices (see tests/conftest.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from intraskill_jax.models import ModelConfig, Qwen3_5ForCausalLM, sharding
from intraskill_jax.models import params as params_lib

MESHES = {
    "data2_fsdp2_tensor2": sharding.MeshConfig(data=2, fsdp=2, tensor=2),
    "fsdp8": sharding.MeshConfig(fsdp=-1),
}
CONFIG = ModelConfig.tiny_qwen3_5(tie_word_embeddings=False)


def _factory():
    return Qwen3_5ForCausalLM(CONFIG, rngs=nnx.Rngs(7))


def _inputs(batch: int = 8, length: int = 20):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, CONFIG.vocab_size, size=(batch, length))
    mask = np.ones((batch, length), np.int32)
    mask[1, :4] = 0  # one left-padded row
    return jnp.asarray(ids), jnp.asarray(mask)


def _loss(model, ids, mask):
    logits = model(ids, attention_mask=mask)
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logp, ids[:, 1:, None], axis=-1)[..., 0]
    return -jnp.sum(picked * mask[:, 1:]) / jnp.sum(mask[:, 1:])


@pytest.fixture(scope="module")
def reference():
    """Unsharded model (one device, initialised under jit like the sharded ones), its logits
    and gradients."""
    one_device = sharding.make_mesh(sharding.MeshConfig(fsdp=1), devices=jax.devices()[:1])
    model = sharding.create_sharded(_factory, one_device)
    ids, mask = _inputs()
    logits = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, mask)
    grads = nnx.jit(nnx.grad(_loss))(model, ids, mask)
    return model, np.asarray(logits), jax.tree.map(np.asarray, nnx.state(grads, nnx.Param))


def _param(model, key: str) -> jax.Array:
    flat = {".".join(map(str, p)): v for p, v in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    return flat[key].get_value()


def test_mesh_config_resolves_the_rest_and_rejects_bad_shapes():
    assert sharding.MeshConfig(data=2, fsdp=-1, tensor=2).resolve(8) == (2, 2, 2)
    assert sharding.MeshConfig(fsdp=-1).resolve(8) == (1, 8, 1)
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=-1))
    assert dict(mesh.shape) == {"data": 2, "fsdp": 4, "tensor": 1}
    with pytest.raises(ValueError, match="does not divide 8 devices"):
        sharding.MeshConfig(tensor=3).resolve(8)
    with pytest.raises(ValueError, match="covers 4 devices"):
        sharding.MeshConfig(data=2, fsdp=2).resolve(8)
    with pytest.raises(ValueError, match="at most one -1"):
        sharding.MeshConfig(data=-1, fsdp=-1).resolve(8)


def test_logical_to_spec_dedups_mesh_axes_and_skips_non_divisible_dims():
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    assert sharding.logical_to_spec(("vocab", "embed"), (300, 64), mesh) == P("tensor", "fsdp")
    # batch takes data and fsdp, so embed (fsdp) must stay replicated on activations.
    assert sharding.logical_to_spec(("batch", "seq", "embed"), (8, 5, 64), mesh) == P(
        ("data", "fsdp"), None, None
    )
    # 6 rows split over data x fsdp = 4 does not divide: keep only the axis that does.
    assert sharding.logical_to_spec(("batch", None), (6, 3), mesh) == P("data", None)
    assert sharding.logical_to_spec(("mlp", "embed"), (7, 64), mesh) == P(None, "fsdp")
    with pytest.raises(KeyError, match="No sharding rule for logical axis 'nonsense'"):
        sharding.logical_to_spec(("nonsense",), (4,), mesh)


def test_constrain_is_a_no_op_outside_a_mesh():
    x = jnp.ones((4, 8))
    assert sharding.constrain(x, ("batch", "embed")) is x


@pytest.mark.parametrize("mesh_name", sorted(MESHES))
def test_sharded_model_matches_unsharded(reference, mesh_name):
    mesh = sharding.make_mesh(MESHES[mesh_name])
    model = sharding.create_sharded(_factory, mesh)
    ref_model, ref_logits, ref_grads = reference
    # Same initial values, now laid out by the rules.
    qkv = _param(model, "model.layers.0.linear_attn.in_proj_qkv.weight")
    expected = (
        P("tensor", "fsdp") if mesh.shape["tensor"] > 1 else P(None, "fsdp")
    )  # size-1 axes left out
    assert qkv.sharding.spec == expected
    assert qkv.addressable_shards[0].data.shape == (
        96 // mesh.shape["tensor"],
        64 // mesh.shape["fsdp"],
    )
    assert _param(model, "model.norm.weight").sharding.spec == P(None)
    np.testing.assert_array_equal(
        qkv, _param(ref_model, "model.layers.0.linear_attn.in_proj_qkv.weight")
    )

    ids, mask = _inputs()
    ids, mask = (jax.device_put(x, sharding.batch_sharding(mesh)) for x in (ids, mask))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
        logits = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, mask)
        # Gradients on the mesh that uses all three axes only: compiling is the slow part.
        grads = nnx.jit(nnx.grad(_loss))(model, ids, mask) if mesh.shape["tensor"] > 1 else None
    assert logits.sharding.spec[0] in ("fsdp", ("data", "fsdp"))
    np.testing.assert_allclose(np.asarray(logits), ref_logits, rtol=1e-5, atol=1e-5)
    if grads is None:
        return
    flat_ref = dict(nnx.to_flat_state(ref_grads))
    for path, var in nnx.to_flat_state(nnx.state(grads, nnx.Param)):
        np.testing.assert_allclose(
            np.asarray(var.get_value()),
            flat_ref[path].get_value(),
            rtol=1e-4,
            atol=1e-6,
            err_msg=".".join(map(str, path)),
        )


def test_load_onto_mesh_gives_sharded_arrays(reference, tmp_path):
    ref_model, ref_logits, _ = reference
    params_lib.save_pretrained(ref_model, tmp_path, max_shard_size=50_000)
    mesh = sharding.make_mesh(MESHES["data2_fsdp2_tensor2"])
    model = params_lib.load_pretrained(tmp_path, mesh=mesh, dtype="float32")
    embed = _param(model, "model.embed_tokens.weight")
    assert embed.sharding.spec == P("tensor", "fsdp")
    assert embed.addressable_shards[0].data.shape == (150, 32)
    assert _param(model, "lm_head.weight").sharding.spec == P("tensor", "fsdp")
    assert _param(model, "model.layers.3.self_attn.q_proj.weight").sharding.spec == P(
        "tensor", "fsdp"
    )
    ids, mask = _inputs()
    with jax.set_mesh(mesh):
        logits = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, ids, mask)
    np.testing.assert_allclose(np.asarray(logits), ref_logits, rtol=1e-5, atol=1e-5)
