"""Gated delta rule: our recurrent and chunked forms against HF's torch reference functions, against
each other (outputs, final state, gradients), and the causal conv with its decode state."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from intraskill_jax.models import gated_delta as gd

HK, HV, DK, DV = 2, 4, 16, 8  # more value heads than key heads


def _inputs(length: int, seed: int, batch: int = 2):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(batch, length, HK, DK)).astype(np.float32)
    k = rng.normal(size=(batch, length, HK, DK)).astype(np.float32)
    v = rng.normal(size=(batch, length, HV, DV)).astype(np.float32)
    g = (-0.5 * np.abs(rng.normal(size=(batch, length, HV)))).astype(np.float32)
    beta = rng.uniform(size=(batch, length, HV)).astype(np.float32)
    state = rng.normal(size=(batch, HV, DK, DV)).astype(np.float32)
    return q, k, v, g, beta, state


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.abs(a - b).max() / np.abs(b).max()


@pytest.mark.parametrize("length", [1, 63, 64, 65, 130])
def test_matches_transformers_reference(length):
    q, k, v, g, beta, state = _inputs(length, seed=length)
    t = torch.tensor
    ref_o, ref_s = hf.torch_recurrent_gated_delta_rule(
        t(q),
        t(k),
        t(v),
        t(g),
        t(beta),
        initial_state=t(state),
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )
    for fn in (gd.recurrent_gated_delta_rule, gd.chunk_gated_delta_rule):
        o, s = jax.jit(fn)(q, k, v, g, beta, state)
        assert _rel(o, ref_o.numpy()) < 1e-5, fn.__name__
        assert _rel(s, ref_s.numpy()) < 1e-5, fn.__name__


@pytest.mark.parametrize("length,chunk", [(1, 64), (65, 64), (130, 64), (40, 16)])
def test_chunked_equals_recurrent_with_gradients(length, chunk):
    args = tuple(jnp.asarray(a) for a in _inputs(length, seed=7 + length))
    rng = np.random.default_rng(0)
    w_o = jnp.asarray(rng.normal(size=(2, length, HV, DV)), jnp.float32)
    w_s = jnp.asarray(rng.normal(size=(2, HV, DK, DV)), jnp.float32)

    def loss(fn, *a):
        o, s = fn(*a)
        return jnp.sum(o * w_o) + jnp.sum(s * w_s)

    chunked = lambda *a: gd.chunk_gated_delta_rule(*a, chunk_size=chunk)
    grad = lambda fn: jax.jit(jax.value_and_grad(lambda *a: loss(fn, *a), argnums=range(6)))
    val_c, grads_c = grad(chunked)(*args)
    val_r, grads_r = grad(gd.recurrent_gated_delta_rule)(*args)
    assert abs(float(val_c) - float(val_r)) <= 1e-5 * abs(float(val_r)) + 1e-4
    for name, a, b in zip(("q", "k", "v", "g", "beta", "state"), grads_c, grads_r):
        assert _rel(a, b) < 1e-4, name


def test_zero_initial_state_equals_none():
    q, k, v, g, beta, _ = _inputs(20, seed=3)
    o1, s1 = gd.chunk_gated_delta_rule(q, k, v, g, beta, chunk_size=8)
    o2, s2 = gd.chunk_gated_delta_rule(
        q, k, v, g, beta, np.zeros((2, HV, DK, DV), np.float32), chunk_size=8
    )
    np.testing.assert_allclose(o1, o2, rtol=1e-6)
    np.testing.assert_allclose(s1, s2, rtol=1e-6)


def test_causal_conv_matches_torch_and_continues_from_state():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 11, 6)).astype(np.float32)
    w = rng.normal(size=(6, 1, 4)).astype(np.float32)
    ref = (
        hf.causal_conv1d_fn(
            torch.tensor(x).transpose(1, 2), torch.tensor(w[:, 0]), activation="silu"
        )
        .transpose(1, 2)
        .numpy()
    )
    y, state = gd.causal_conv1d(jnp.asarray(x), jnp.asarray(w))
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(state, x[:, -3:])
    # Same output when the sequence arrives as 5 tokens, then 1, then 5.
    pieces, s = [], None
    for lo, hi in ((0, 5), (5, 6), (6, 11)):
        y_part, s = gd.causal_conv1d(jnp.asarray(x[:, lo:hi]), jnp.asarray(w), s)
        pieces.append(y_part)
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), y, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(s, state)


def test_causal_conv_skips_masked_tokens_anywhere():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.normal(size=(6, 1, 4)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(1, 3, 6)), jnp.float32)
    real = jnp.asarray(rng.normal(size=(1, 5, 6)), jnp.float32)
    expected_y, expected_state = gd.causal_conv1d(real, w, state)
    # The same 5 real tokens interleaved with 4 masked ones (random values) in a 9-token segment.
    mask = np.array([[0, 1, 1, 0, 0, 1, 1, 0, 1]], bool)
    x = np.asarray(rng.normal(size=(1, 9, 6)), np.float32)
    x[mask] = np.asarray(real[0])
    y, new_state = gd.causal_conv1d(jnp.asarray(x), w, state, jnp.asarray(mask))
    np.testing.assert_allclose(np.asarray(y)[mask], np.asarray(expected_y[0]), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(new_state, expected_state, rtol=1e-6)
    # No real token at all: the state is carried unchanged.
    _, kept = gd.causal_conv1d(jnp.asarray(x[:, :1]), w, state, jnp.zeros((1, 1), bool))
    np.testing.assert_array_equal(kept, state)


def test_causal_conv_one_token_step_matches_the_general_masked_path():
    """The one-token decode form (a select) equals the general compaction path, for real and
    absent tokens alike."""
    rng = np.random.default_rng(2)
    w = jnp.asarray(rng.normal(size=(6, 1, 4)), jnp.float32)
    state = jnp.asarray(rng.normal(size=(3, 3, 6)), jnp.float32)
    x = jnp.asarray(rng.normal(size=(3, 1, 6)), jnp.float32)
    mask = jnp.asarray([[True], [False], [True]])
    y, new_state = gd.causal_conv1d(x, w, state, mask)
    # The general path on the same token followed by an always-absent one.
    pad = jnp.concatenate([x, jnp.zeros_like(x)], axis=1)
    y2, state2 = gd.causal_conv1d(pad, w, state, jnp.concatenate([mask, jnp.zeros_like(mask)], axis=1))
    np.testing.assert_allclose(np.asarray(y)[np.asarray(mask)], np.asarray(y2[:, :1])[np.asarray(mask)], rtol=1e-6)
    np.testing.assert_allclose(new_state, state2, rtol=1e-6)
    np.testing.assert_array_equal(new_state[1], state[1])  # the absent row keeps its state
