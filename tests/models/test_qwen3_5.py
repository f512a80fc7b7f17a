"""Qwen3.5 parity with HF `Qwen3_5ForCausalLM` (fp32, tiny config, randomised norms/A_log/dt_bias)
and cache behaviour (prefill + decode == one full forward). Compiles dominate the runtime, so
each test reuses module-level jitted functions and shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, init_cache
from tests.models.hf_reference import hf_logits, left_padded, paired_models, rel_err

# Hv (4) > Hk (2), 3 DeltaNet layers + 1 attention layer; larger init so every path carries signal.
CONFIG = ModelConfig.tiny_qwen3_5(initializer_range=0.1)
# One layer of each kind and a 16-token chunk: multi-chunk prefill at short lengths, fast compiles.
SMALL = CONFIG.replace(
    num_hidden_layers=2, layer_types=("linear_attention", "full_attention"), gdn_chunk_size=16
)

_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
_cached = nnx.jit(lambda m, ids, mask, cache: m(ids, mask, cache=cache))


@pytest.fixture(scope="module")
def models():
    return paired_models(CONFIG, seed=0)


@pytest.fixture(scope="module")
def small_model():
    return paired_models(SMALL, seed=2)[1]


@pytest.mark.parametrize("length", [1, 63, 64, 65, 130])
def test_logits_match_transformers(models, length):
    """Rows: unpadded, left-padded by 1 and by 17 (random pad ids); only real positions compared."""
    ref, ours = models
    rng = np.random.default_rng(length)
    pads = [0, min(1, length - 1), min(17, length - 1)]
    ids, mask = left_padded(rng, 3, length, CONFIG.vocab_size, pads)
    expected = hf_logits(ref, ids, mask)
    got = np.asarray(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
    assert got.shape == (3, length, CONFIG.vocab_size)
    assert rel_err(got, expected, mask) < 1e-4
    if length == 65:  # attention_mask=None is the all-ones mask
        unmasked = np.asarray(_forward(ours, jnp.asarray(ids[:1]), None))
        assert rel_err(unmasked, hf_logits(ref, ids[:1], None)) < 1e-4


def test_parameter_paths_are_hf_keys_with_logical_axes(models):
    ref, ours = models
    vocabulary = {
        "vocab",
        "embed",
        "mlp",
        "q_heads_dim",
        "kv_heads_dim",
        "linear_qkv",
        "linear_z",
        "linear_heads",
        "conv_kernel",
        "norm",
        None,
    }
    flat = nnx.to_flat_state(nnx.state(ours, nnx.Param))
    assert {".".join(map(str, p)) for p, _ in flat} == set(ref.state_dict())
    for path, var in flat:
        axes = var.get_metadata()["out_sharding"]
        assert len(axes) == var.get_value().ndim and set(axes) <= vocabulary, (path, axes)


def _incremental(model, ids, mask, prompt_len, max_length=48):
    cache = init_cache(SMALL, ids.shape[0], max_length)
    logits, cache = _cached(
        model, jnp.asarray(ids[:, :prompt_len]), jnp.asarray(mask[:, :prompt_len]), cache
    )
    pieces = [np.asarray(logits)]
    for t in range(prompt_len, ids.shape[1]):
        logits, cache = _cached(
            model, jnp.asarray(ids[:, t : t + 1]), jnp.asarray(mask[:, t : t + 1]), cache
        )
        pieces.append(np.asarray(logits))
    return np.concatenate(pieces, axis=1), cache


@pytest.mark.parametrize("prompt_len", [1, 20])
def test_prefill_then_decode_equals_full_forward(small_model, prompt_len):
    rng = np.random.default_rng(prompt_len)
    ids, mask = left_padded(rng, 2, 40, SMALL.vocab_size, [0, 0 if prompt_len == 1 else 7])
    full = np.asarray(_forward(small_model, jnp.asarray(ids), jnp.asarray(mask)))
    incremental, cache = _incremental(small_model, ids, mask, prompt_len)
    assert rel_err(incremental, full, mask) < 1e-5
    np.testing.assert_array_equal(np.asarray(cache.length), mask.sum(1))
    np.testing.assert_array_equal(np.asarray(cache.next_position), mask.sum(1))


def test_multi_token_continuation_equals_full_forward(small_model):
    """Prefill in two pieces: chunked kernel from a non-zero state, conv state carried over."""
    rng = np.random.default_rng(1)
    ids, mask = left_padded(rng, 2, 40, SMALL.vocab_size, [4, 0])
    full = np.asarray(_forward(small_model, jnp.asarray(ids), jnp.asarray(mask)))
    cache = init_cache(SMALL, 2, 48)
    a, cache = _cached(small_model, jnp.asarray(ids[:, :20]), jnp.asarray(mask[:, :20]), cache)
    b, cache = _cached(small_model, jnp.asarray(ids[:, 20:]), jnp.asarray(mask[:, 20:]), cache)
    assert rel_err(np.concatenate([a, b], axis=1), full, mask) < 1e-5


def test_masked_decode_token_leaves_state_unchanged(small_model):
    ids = np.random.default_rng(2).integers(0, SMALL.vocab_size, size=(2, 21))
    mask = np.ones((2, 21), np.int32)
    cache = init_cache(SMALL, 2, 48)
    _, cache = _cached(small_model, jnp.asarray(ids[:, :20]), jnp.asarray(mask[:, :20]), cache)
    _, after = _cached(small_model, jnp.asarray(ids[:, 20:]), jnp.zeros((2, 1), jnp.int32), cache)
    delta_net = cache.layers[0]
    np.testing.assert_array_equal(delta_net.recurrent_state, after.layers[0].recurrent_state)
    np.testing.assert_array_equal(delta_net.conv_state, after.layers[0].conv_state)
    np.testing.assert_array_equal(after.next_position, [20, 20])
    assert not np.asarray(after.key_valid)[:, 20].any()


def test_masked_tokens_anywhere_are_skipped(small_model):
    """Padding inside a sequence, and inside a cached continuation, equals leaving it out."""
    rng = np.random.default_rng(4)
    real = rng.integers(0, SMALL.vocab_size, size=(2, 30))
    compact = np.asarray(_forward(small_model, jnp.asarray(real), None))
    # Row 0: 5 pads after the first 10 tokens; row 1: 5 pads at the end (right padding).
    ids = rng.integers(0, SMALL.vocab_size, size=(2, 35))
    mask = np.ones((2, 35), bool)
    mask[0, 10:15] = False
    mask[1, 30:] = False
    ids[mask] = real.reshape(-1)
    got = np.asarray(_forward(small_model, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got[mask].reshape(2, 30, -1), compact) < 1e-5
    # Cached: prefill the first 10, then a 25-token segment whose rows are padded differently.
    cache = init_cache(SMALL, 2, 48)
    first, cache = _cached(small_model, jnp.asarray(ids[:, :10]), jnp.asarray(mask[:, :10]), cache)
    rest, cache = _cached(small_model, jnp.asarray(ids[:, 10:]), jnp.asarray(mask[:, 10:]), cache)
    pieces = np.concatenate([first, rest], axis=1)
    assert rel_err(pieces[mask].reshape(2, 30, -1), compact) < 1e-5
    np.testing.assert_array_equal(cache.next_position, [30, 30])


def test_bfloat16_compute_tracks_float32(small_model):
    """bf16 compute (fp32 params) stays near fp32; HF's own bf16 drift here is about 4e-2."""
    bf16 = type(small_model)(SMALL.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
    nnx.update(bf16, nnx.state(small_model))
    ids, mask = left_padded(np.random.default_rng(5), 2, 30, SMALL.vocab_size, [3, 0])
    expected = np.asarray(_forward(small_model, jnp.asarray(ids), jnp.asarray(mask)))
    got = _forward(bf16, jnp.asarray(ids), jnp.asarray(mask))
    assert got.dtype == jnp.float32 and rel_err(got, expected, mask) < 0.1
    cache = init_cache(bf16.config, 2, 32)
    assert cache.layers[0].conv_state.dtype == cache.layers[1].key.dtype == jnp.bfloat16
    assert cache.layers[0].recurrent_state.dtype == jnp.float32


@pytest.mark.parametrize("remat", ["full", "minimal", "dots_saveable"])
def test_remat_policy_keeps_gradients(small_model, remat):
    ids = jnp.asarray(np.random.default_rng(3).integers(0, SMALL.vocab_size, size=(2, 12)))
    state = nnx.state(small_model)
    rematted = nnx.merge(
        *nnx.split(type(small_model)(SMALL.replace(remat=remat), rngs=nnx.Rngs(0)))
    )
    nnx.update(rematted, state)

    def loss(m):
        return jnp.mean(jax.nn.logsumexp(m(ids), axis=-1))

    expected = jax.tree.leaves(nnx.jit(nnx.grad(loss))(small_model))
    got = jax.tree.leaves(nnx.jit(nnx.grad(loss))(rematted))
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_blocked_attention_matches_transformers_and_full_attention(models):
    """attention_block_size (query blocks of 16 over 65 padded tokens, last block partial) gives
    transformers' logits, and the gradients of the whole-sequence kernel."""
    ref, ours = models
    blocked = type(ours)(CONFIG.replace(attention_block_size=16), rngs=nnx.Rngs(0))
    nnx.update(blocked, nnx.state(ours))
    ids, mask = left_padded(np.random.default_rng(7), 3, 65, CONFIG.vocab_size, [0, 1, 17])
    got = np.asarray(_forward(blocked, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got, hf_logits(ref, ids, mask), mask) < 1e-4

    def loss(m):
        logits = m(jnp.asarray(ids), jnp.asarray(mask))
        return jnp.sum(jax.nn.logsumexp(logits, axis=-1) * jnp.asarray(mask))

    expected = jax.tree.leaves(nnx.jit(nnx.grad(loss))(ours))
    for a, b in zip(jax.tree.leaves(nnx.jit(nnx.grad(loss))(blocked)), expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * float(np.abs(b).max()))
