"""Chunked token log-probs equal log_softmax of full logits (values, entropy, gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.models import logprobs as logprobs_module
from intraskill_jax.models import (
    ModelConfig,
    Qwen3ForCausalLM,
    logprobs_from_hidden,
    token_logprobs,
)


def _reference(hidden, w, targets, temperature):
    logits = jnp.einsum("btd,vd->btv", hidden, w) / temperature
    logp = jax.nn.log_softmax(logits, axis=-1)
    picked = jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    return picked, -jnp.sum(jnp.exp(logp) * logp, axis=-1)


@pytest.mark.parametrize("remat", [False, True], ids=["logits-saved", "logits-recomputed"])
@pytest.mark.parametrize("length,chunk,temperature", [(13, 4, 1.0), (16, 16, 0.7), (5, 64, 1.3)])
def test_matches_full_log_softmax(length, chunk, temperature, remat, monkeypatch):
    if remat:  # the large-vocabulary path: chunks rematerialised in the backward pass
        monkeypatch.setattr(logprobs_module, "SAVE_LOGITS_BYTES", 0)
    rng = np.random.default_rng(length)
    hidden = jnp.asarray(rng.normal(size=(2, length, 8)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(50, 8)), jnp.float32)
    targets = jnp.asarray(rng.integers(0, 50, size=(2, length)))
    lp, ent = logprobs_from_hidden(
        hidden, w, targets, chunk_size=chunk, temperature=temperature, return_entropy=True
    )
    ref_lp, ref_ent = _reference(hidden, w, targets, temperature)
    np.testing.assert_allclose(lp, ref_lp, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ent, ref_ent, rtol=1e-5, atol=1e-5)

    weights = jnp.asarray(rng.normal(size=(2, length)), jnp.float32)
    ours = jax.jit(
        jax.grad(
            lambda h, w: jnp.sum(
                weights
                * logprobs_from_hidden(h, w, targets, chunk_size=chunk, temperature=temperature)
            ),
            argnums=(0, 1),
        )
    )(hidden, w)
    ref = jax.grad(
        lambda h, w: jnp.sum(weights * _reference(h, w, targets, temperature)[0]), argnums=(0, 1)
    )(hidden, w)
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_token_logprobs_on_model_matches_logits():
    cfg = ModelConfig.tiny_qwen3(num_hidden_layers=1, logits_chunk_size=8)
    model = Qwen3ForCausalLM(cfg, rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, cfg.vocab_size, size=(2, 19)))
    mask = jnp.asarray(np.r_[[0, 0, 0] + [1] * 16, [1] * 19].reshape(2, 19))
    targets = jnp.roll(ids, -1, axis=1)
    lp = nnx.jit(token_logprobs)(model, ids, targets, mask)
    full = jax.nn.log_softmax(nnx.jit(lambda m, i, a: m(i, a))(model, ids, mask), axis=-1)
    ref = jnp.take_along_axis(full, targets[..., None], axis=-1)[..., 0]
    np.testing.assert_allclose(lp, jnp.where(mask == 1, ref, 0.0), rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(lp)[0, :3] == 0.0)
