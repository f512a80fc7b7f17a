"""Llama parity with HF `LlamaForCausalLM` (fp32, every norm and bias randomised): logits, a
training step's gradients, RoPE scaling, prefill + decode == full forward, and config.json."""

import copy

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from intraskill_jax.models import LlamaForCausalLM, ModelConfig, config_from_hf, hf_config, init_cache
from intraskill_jax.models.config import RopeScaling
from tests.models.hf_reference import hf_logits, left_padded, paired_models, rel_err

CONFIG = ModelConfig.tiny_llama(initializer_range=0.1)
_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
_cached = nnx.jit(lambda m, ids, mask, cache: m(ids, mask, cache=cache))
LLAMA3 = RopeScaling(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                     original_max_position_embeddings=64)

VARIANTS = {
    "untied": CONFIG,
    "tied": CONFIG.replace(tie_word_embeddings=True),
    "biases": CONFIG.replace(attention_bias=True, mlp_bias=True),
    # original context 64 puts the tiny head's wavelengths on all three sides of the llama3 bands
    "llama3_rope": CONFIG.replace(rope_scaling=LLAMA3),
    "linear_rope": CONFIG.replace(rope_scaling=RopeScaling(rope_type="linear", factor=4.0)),
}


@pytest.fixture(scope="module", params=list(VARIANTS))
def models(request):
    return paired_models(VARIANTS[request.param], seed=0)


@pytest.mark.parametrize("length", [1, 65, 130])
def test_logits_match_transformers(models, length):
    ref, ours = models
    ids, mask = left_padded(np.random.default_rng(length), 3, length, CONFIG.vocab_size,
                            [0, min(1, length - 1), min(17, length - 1)])
    got = np.asarray(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got, hf_logits(ref, ids, mask), mask) < 1e-4


def test_llama3_bands_are_all_in_play():
    """The scaled frequencies keep some, divide some by the factor and interpolate the rest, so
    the parity above covers every branch of the rule."""
    from intraskill_jax.models.layers import rope_cos_sin

    plain_cos, _ = rope_cos_sin(jnp.ones((1, 1)), CONFIG.head_dim, CONFIG.rope_theta)
    inv = 1.0 / CONFIG.rope_theta ** (np.arange(0, CONFIG.head_dim, 2) / CONFIG.head_dim)
    scaled = np.asarray(LLAMA3.scale(jnp.asarray(inv, jnp.float32)))
    ratio = inv / scaled
    assert np.isclose(ratio, 1.0).any() and np.isclose(ratio, LLAMA3.factor).any()
    assert ((ratio > 1.01) & (ratio < LLAMA3.factor - 0.01)).any()
    assert np.allclose(np.asarray(plain_cos)[0, 0, : CONFIG.head_dim // 2], np.cos(inv), atol=1e-6)


def _nll(logits, targets, mask):
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return -(picked * mask).sum() / mask.sum()


def float64_reference_grads(ref, ids, mask, targets, weight) -> dict[str, np.ndarray]:
    """transformers' gradients of the same loss in float64: exact arithmetic to compare a float32
    backward with (two float32 ones part by more than either parts from float64: 1.3e-4 for
    SmolLM2's worst tensor on an AVX2 CPU)."""
    ref64 = copy.deepcopy(ref).to(torch.float64)
    # In float64 eager attention turns the left pads' fully masked rows into NaN (and with them
    # every gradient); SDPA does not.
    ref64.set_attn_implementation("sdpa")
    positions = torch.tensor(np.maximum(np.cumsum(mask, 1) - 1, 0))
    logits = ref64(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask), position_ids=positions).logits
    logp = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(targets)[..., None])[..., 0]
    w = torch.tensor(weight, dtype=torch.float64)
    (-(logp * w).sum() / w.sum()).backward()
    return {name: p.grad.numpy() for name, p in ref64.named_parameters()}


@pytest.mark.parametrize("variant", ["tied", "llama3_rope"])
def test_a_training_steps_gradients_match_transformers(variant):
    """Every parameter's gradient of a padded batch's next-token loss, against torch autograd in
    float64."""
    ref, ours = paired_models(VARIANTS[variant], seed=3)
    ids, mask = left_padded(np.random.default_rng(4), 2, 40, CONFIG.vocab_size, [0, 9])
    targets = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)
    weight = (mask * np.concatenate([mask[:, 1:], np.zeros_like(mask[:, :1])], axis=1)).astype(np.float32)

    grads = nnx.grad(lambda m: _nll(m(jnp.asarray(ids), jnp.asarray(mask)), jnp.asarray(targets),
                                    jnp.asarray(weight)))(ours)
    ours_grads = {".".join(map(str, k)): np.asarray(v.get_value())
                  for k, v in nnx.to_flat_state(nnx.state(grads, nnx.Param))}

    ref_grads = float64_reference_grads(ref, ids, mask, targets, weight)

    assert set(ours_grads) == set(ref_grads)
    for name, expected in ref_grads.items():
        assert rel_err(ours_grads[name], expected) < 1e-4, name


def test_prefill_then_decode_equals_full_forward():
    model = paired_models(VARIANTS["llama3_rope"], seed=1)[1]
    ids, mask = left_padded(np.random.default_rng(0), 2, 24, CONFIG.vocab_size, [5, 0])
    full = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    cache = init_cache(model.config, 2, 32)
    logits, cache = _cached(model, jnp.asarray(ids[:, :10]), jnp.asarray(mask[:, :10]), cache)
    pieces = [np.asarray(logits)]
    for t in range(10, 24):
        logits, cache = _cached(model, jnp.asarray(ids[:, t : t + 1]), jnp.asarray(mask[:, t : t + 1]), cache)
        pieces.append(np.asarray(logits))
    assert rel_err(np.concatenate(pieces, axis=1), full, mask) < 1e-5


def test_no_qk_norm_parameters_and_hf_keys_only():
    model = LlamaForCausalLM(CONFIG, rngs=nnx.Rngs(0))
    keys = {".".join(map(str, k)) for k, _ in nnx.to_flat_state(nnx.state(model, nnx.Param))}
    assert not any("q_norm" in k or "k_norm" in k for k in keys)
    assert "model.layers.1.self_attn.q_proj.weight" in keys and "lm_head.weight" in keys


def test_config_json_as_transformers_writes_it():
    """Configs transformers saves (legacy top-level rope_theta + rope_scaling, or v5's
    rope_parameters) read back to the same model; ours load into LlamaConfig unchanged."""
    from transformers import LlamaConfig

    for config in (CONFIG, VARIANTS["llama3_rope"], VARIANTS["biases"], VARIANTS["tied"]):
        hf = hf_config(config)
        assert config_from_hf(hf, dtype="float32", param_dtype="float32") == config
        body = {k: v for k, v in hf.items() if k not in ("model_type", "architectures")}
        saved = LlamaConfig(**body).to_dict()
        assert config_from_hf(saved, dtype="float32", param_dtype="float32") == config
    legacy = {k: v for k, v in hf_config(VARIANTS["llama3_rope"]).items() if k != "rope_parameters"}
    legacy.update(rope_theta=CONFIG.rope_theta, rope_scaling=LLAMA3.to_hf())
    assert config_from_hf(legacy, dtype="float32", param_dtype="float32") == VARIANTS["llama3_rope"]
    with pytest.raises(ValueError, match="rope_type 'dynamic'"):
        config_from_hf({**legacy, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})
    with pytest.raises(ValueError, match="needs a 'factor'"):
        config_from_hf({**legacy, "rope_scaling": {"rope_type": "linear"}})


def test_smollm2_preset_is_its_architecture():
    config = ModelConfig.smollm2_135m(dtype="float32", param_dtype="float32")
    shapes = jax.eval_shape(lambda: nnx.state(LlamaForCausalLM(config, rngs=nnx.Rngs(0)), nnx.Param))
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(shapes)) == 134_515_008


def test_sharded_over_data_fsdp_and_tensor_matches_unsharded():
    """The logical-axis rules lay a Llama out over all three mesh axes (8 fake CPU devices), and the
    sharded forward pass equals the unsharded one."""
    from jax.sharding import PartitionSpec as P

    from intraskill_jax.models import sharding

    config = CONFIG.replace(num_attention_heads=6, num_key_value_heads=2)
    factory = lambda: LlamaForCausalLM(config, rngs=nnx.Rngs(5))  # noqa: E731
    unsharded = factory()
    mesh = sharding.make_mesh(sharding.MeshConfig(data=2, fsdp=2, tensor=2))
    model = sharding.create_sharded(factory, mesh)
    q = model.model.layers[0].self_attn.q_proj.weight.get_value()
    assert q.sharding.spec == P("tensor", "fsdp") and q.addressable_shards[0].data.shape == (48, 32)
    ids, mask = left_padded(np.random.default_rng(2), 8, 20, config.vocab_size, [0, 4, 0, 0, 0, 0, 0, 1])
    expected = np.asarray(_forward(unsharded, jnp.asarray(ids), jnp.asarray(mask)))
    with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.DEFAULT_RULES):
        batch = [jax.device_put(jnp.asarray(x), sharding.batch_sharding(mesh)) for x in (ids, mask)]
        got = nnx.jit(lambda m, i, a: m(i, attention_mask=a))(model, *batch)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


# -- SmolLM2-135M-Instruct itself: the registry's wheel, converted once per session -------------


@pytest.fixture(scope="module")
def smollm2_pair(tmp_path_factory):
    """(transformers' LlamaForCausalLM, ours) on the converted SmolLM2 directory, both fp32."""
    from transformers import LlamaForCausalLM as HFLlama

    from intraskill_jax.models import load_pretrained
    from tests.models import gguf_files

    hf_dir = gguf_files.smollm2(tmp_path_factory).hf_dir
    ref = HFLlama.from_pretrained(str(hf_dir), dtype=torch.float32, attn_implementation="eager").eval()
    return ref, load_pretrained(hf_dir, dtype="float32")


@pytest.mark.slow
def test_smollm2_logits_and_gradients_match_transformers(smollm2_pair):
    """Logits against transformers' float32 forward; gradients against its float64 backward."""
    ref, ours = smollm2_pair
    assert ours.config == ModelConfig.smollm2_135m(dtype="float32", param_dtype="float32")
    ids, mask = left_padded(np.random.default_rng(7), 2, 48, ours.config.vocab_size, [0, 11])
    got = np.asarray(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got, hf_logits(ref, ids, mask), mask) < 1e-4

    targets = np.concatenate([ids[:, 1:], ids[:, :1]], axis=1)
    weight = (mask * np.concatenate([mask[:, 1:], np.zeros_like(mask[:, :1])], axis=1)).astype(np.float32)
    grads = nnx.jit(nnx.grad(lambda m: _nll(m(jnp.asarray(ids), jnp.asarray(mask)), jnp.asarray(targets),
                                            jnp.asarray(weight))))(ours)
    ours_grads = {".".join(map(str, k)): np.asarray(v.get_value())
                  for k, v in nnx.to_flat_state(nnx.state(grads, nnx.Param))}
    ref_grads = float64_reference_grads(ref, ids, mask, targets, weight)
    assert set(ours_grads) == set(ref_grads) and len(ref_grads) == 272
    worst = max(ref_grads, key=lambda k: rel_err(ours_grads[k], ref_grads[k]))
    assert rel_err(ours_grads[worst], ref_grads[worst]) < 1e-4, worst
