"""Qwen3 dense parity with HF `Qwen3ForCausalLM` (plain-w norms randomised, tied embeddings) and
prefill + decode == full forward."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, Qwen3ForCausalLM, init_cache
from tests.models.hf_reference import hf_logits, left_padded, paired_models, rel_err

CONFIG = ModelConfig.tiny_qwen3(initializer_range=0.1)
_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
_cached = nnx.jit(lambda m, ids, mask, cache: m(ids, mask, cache=cache))


@pytest.fixture(scope="module", params=[True, False], ids=["tied", "untied"])
def models(request):
    return paired_models(CONFIG.replace(tie_word_embeddings=request.param), seed=0)


@pytest.mark.parametrize("length", [1, 63, 64, 65, 130])
def test_logits_match_transformers(models, length):
    ref, ours = models
    ids, mask = left_padded(
        np.random.default_rng(length),
        3,
        length,
        CONFIG.vocab_size,
        [0, min(1, length - 1), min(17, length - 1)],
    )
    got = np.asarray(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got, hf_logits(ref, ids, mask), mask) < 1e-4


def test_prefill_then_decode_equals_full_forward():
    model = paired_models(CONFIG, seed=1)[1]
    ids, mask = left_padded(np.random.default_rng(0), 2, 24, CONFIG.vocab_size, [5, 0])
    full = np.asarray(_forward(model, jnp.asarray(ids), jnp.asarray(mask)))
    cache = init_cache(CONFIG, 2, 32)
    logits, cache = _cached(model, jnp.asarray(ids[:, :10]), jnp.asarray(mask[:, :10]), cache)
    pieces = [np.asarray(logits)]
    for t in range(10, 24):
        logits, cache = _cached(
            model, jnp.asarray(ids[:, t : t + 1]), jnp.asarray(mask[:, t : t + 1]), cache
        )
        pieces.append(np.asarray(logits))
    assert rel_err(np.concatenate(pieces, axis=1), full, mask) < 1e-5


def test_family_is_checked():
    with pytest.raises(ValueError, match="family='qwen3'"):
        Qwen3ForCausalLM(ModelConfig.tiny_qwen3_5(), rngs=nnx.Rngs(0))


def test_attention_bias_variant_matches_transformers():
    ref, ours = paired_models(CONFIG.replace(attention_bias=True), seed=2)
    ids, mask = left_padded(np.random.default_rng(3), 3, 63, CONFIG.vocab_size, [0, 1, 17])
    got = np.asarray(_forward(ours, jnp.asarray(ids), jnp.asarray(mask)))
    assert rel_err(got, hf_logits(ref, ids, mask), mask) < 1e-4
