"""The tiny models and the sampler shape the rollout tests share (no test module imports another)."""

import jax
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.rollout.jax_sampler import SamplerConfig

# One sampler shape for every test: the jitted programs compile once per model family.
SMALL = SamplerConfig(max_batch=4, max_length=160, prefill_buckets=(8, 32), decode_buckets=(16,))


PRESETS = {"qwen3_5": ModelConfig.tiny_qwen3_5, "qwen3": ModelConfig.tiny_qwen3, "llama": ModelConfig.tiny_llama}


def make_model(family):
    cfg = PRESETS[family]()
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    # Random norm weights and DeltaNet gates, so the test is not blind to 1+w vs w mistakes.
    state = nnx.state(model, nnx.Param)
    leaves, tree = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    leaves = [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) if x.ndim <= 1 else x for x, k in zip(leaves, keys)]
    nnx.update(model, jax.tree.unflatten(tree, leaves))
    if family != "qwen3_5":
        # At the default init a dense model's residual stream is its token's own embedding, so with
        # tied embeddings greedy decoding repeats the last token whatever attention returns; larger
        # layer weights (8x) make the next token depend on the context, so the tests can fail.
        layers = nnx.state(model.model.layers, nnx.Param)
        nnx.update(model.model.layers, jax.tree.map(lambda x: 8.0 * x if x.ndim == 2 else x, layers))
    return model
