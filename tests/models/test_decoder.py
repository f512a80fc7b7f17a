"""The shared decoder stack: scan_layers (one `lax.scan` over repeats of the layer period) against
the unrolled layers, which the family parity tests check against transformers."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class, init_cache, sharding

# Qwen3.5: 8 layers, two repeats of its period of 4 (3 DeltaNet + 1 attention); Qwen3: 3 attention
# layers, period 1. A larger init so every layer carries signal.
CONFIGS = {
    "qwen3_5": ModelConfig.tiny_qwen3_5(num_hidden_layers=8, initializer_range=0.1, gdn_chunk_size=16),
    "qwen3": ModelConfig.tiny_qwen3(num_hidden_layers=3, initializer_range=0.1),
}

LIN, FULL = "linear_attention", "full_attention"

_forward = nnx.jit(lambda m, ids, mask: m(ids, mask))
_cached = nnx.jit(lambda m, ids, mask, cache: m(ids, mask, cache=cache))


def _pair(config: ModelConfig, **changes):
    """(unrolled, scanned) models with the same parameters."""
    unrolled = causal_lm_class(config)(config.replace(**changes), rngs=nnx.Rngs(0))
    scanned_config = config.replace(scan_layers=True, **changes)
    scanned = causal_lm_class(config)(scanned_config, rngs=nnx.Rngs(1))
    nnx.update(scanned, nnx.state(unrolled, nnx.Param))
    return unrolled, scanned


def _padded_inputs(config: ModelConfig, length: int = 40):
    """Row 0 unpadded, row 1 left-padded by 9, row 2 with a gap of 5 pads inside."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, config.vocab_size, size=(3, length))
    mask = np.ones((3, length), np.int32)
    mask[1, :9] = 0
    mask[2, 12:17] = 0
    return jnp.asarray(ids), jnp.asarray(mask)


def _loss(model, ids, mask):
    logits = model(ids, mask)
    return jnp.sum(jax.nn.logsumexp(logits, axis=-1) * mask) + jnp.sum(logits[..., 3] * mask)


def test_layer_period_is_the_pattern_repeat():
    assert ModelConfig.qwen3_5_4b().layer_period == 4
    assert ModelConfig.qwen3_4b().layer_period == 1
    assert CONFIGS["qwen3_5"].layer_period == 4
    assert ModelConfig.tiny_qwen3_5(num_hidden_layers=6, layer_types=(LIN, FULL) * 3).layer_period == 2
    # No shorter repeat: the whole stack is one period (a scan of one step).
    assert ModelConfig.tiny_qwen3_5(num_hidden_layers=3, layer_types=(LIN, LIN, FULL)).layer_period == 3


# l f l l f repeats every 3 layers, 3 does not divide 5; the default pattern of 6 layers (l l l f l l)
# repeats every 4.
@pytest.mark.parametrize("layers", [{"num_hidden_layers": 5, "layer_types": (LIN, FULL, LIN, LIN, FULL)},
                                    {"num_hidden_layers": 6}], ids=["given", "default"])
def test_scan_layers_needs_a_period_dividing_the_layers(layers):
    config = ModelConfig.tiny_qwen3_5(**layers)  # fine unrolled
    n = layers["num_hidden_layers"]
    with pytest.raises(ValueError, match=rf"scan_layers needs a layer pattern .* period dividing "
                                         rf"num_hidden_layers \({n}\); layer_types .* repeats every "
                                         r"\d layers\. Set scan_layers=False"):
        config.replace(scan_layers=True)


# Scanned and unrolled run the same per-layer computation (remat included), so fp32 results agree
# to rounding (bit for bit on this CPU).
@pytest.mark.parametrize("remat", ["none", "full"])
@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_scan_gives_the_unrolled_logits_and_gradients(family, remat):
    config = CONFIGS[family]
    unrolled, scanned = _pair(config, remat=remat)
    ids, mask = _padded_inputs(config)
    np.testing.assert_allclose(_forward(scanned, ids, mask), _forward(unrolled, ids, mask), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(_forward(scanned, ids, None), _forward(unrolled, ids, None), rtol=1e-6, atol=1e-6)
    grad = nnx.jit(nnx.grad(_loss))
    expected = nnx.to_flat_state(nnx.state(grad(unrolled, ids, mask), nnx.Param))
    got = dict(nnx.to_flat_state(nnx.state(grad(scanned, ids, mask), nnx.Param)))
    assert len(got) == len(expected)
    for path, want in expected:
        want = np.asarray(want.get_value())
        np.testing.assert_allclose(got[path].get_value(), want, rtol=1e-6, atol=1e-6 * np.abs(want).max(),
                                   err_msg=".".join(map(str, path)))


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_cached_path_stays_unrolled_and_matches(family):
    """Prefill + decode of a scan_layers model is the unrolled model's, and equals its scanned full
    forward."""
    config = CONFIGS[family]
    unrolled, scanned = _pair(config)
    ids, mask = _padded_inputs(config, length=24)
    ids, mask = ids[:2], mask[:2]  # unpadded and left-padded rows

    def incremental(model):
        cache = init_cache(model.config, 2, 32)
        logits, cache = _cached(model, ids[:, :20], mask[:, :20], cache)
        pieces = [logits]
        for t in range(20, 24):
            logits, cache = _cached(model, ids[:, t : t + 1], mask[:, t : t + 1], cache)
            pieces.append(logits)
        return np.concatenate(pieces, axis=1)

    got = incremental(scanned)
    np.testing.assert_array_equal(got, incremental(unrolled))
    full = np.asarray(_forward(scanned, ids, mask))
    real = np.asarray(mask, bool)
    np.testing.assert_allclose(got[real], full[real], rtol=1e-4, atol=1e-5)


def test_stacked_parameters_keep_their_sharding():
    """On a 4-device fsdp mesh the scan's stacked [2, ...] parameters are split like one layer's
    (mlp weights shard their 'embed' dimension, 64 -> 16) and never replicated whole."""
    config = CONFIGS["qwen3_5"].replace(intermediate_size=96, scan_layers=True, remat="full")
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=4), devices=jax.devices()[:4])
    model = sharding.create_sharded(lambda: causal_lm_class(config)(config, rngs=nnx.Rngs(0)), mesh)
    graphdef, state = nnx.split(model)
    ids = jnp.zeros((4, 16), jnp.int32)

    def loss(state):
        return jnp.sum(jax.nn.logsumexp(nnx.merge(graphdef, state)(ids), axis=-1))

    with jax.set_mesh(mesh):
        hlo = jax.jit(jax.grad(loss)).lower(state).compile().as_text()
    stacked = set(re.findall(r"f32\[2,(?:96,16|16,96|96,64|64,96)\]", hlo))
    assert stacked == {"f32[2,96,16]", "f32[2,16,96]"}  # up/gate_proj [mlp, embed], down_proj [embed, mlp]


def _logsumexp_loss(model: nnx.Module, ids: jax.Array) -> jax.Array:
    return jnp.mean(jax.nn.logsumexp(model(ids), axis=-1))


def _saved_residual_shapes(model: nnx.Module, ids: jax.Array, capsys) -> list[tuple[int, ...]]:
    """Shapes of what the backward pass of `model`'s loss keeps from its forward (parameters aside)."""
    from jax.ad_checkpoint import print_saved_residuals

    graphdef, state = nnx.split(model)
    capsys.readouterr()
    print_saved_residuals(lambda state: _logsumexp_loss(nnx.merge(graphdef, state), ids), state)
    shapes = []
    for line in capsys.readouterr().out.splitlines():
        if "from the argument" in line:
            continue
        dims = re.match(r"\w+\[([\d,]*)\]", line)
        shapes.append(tuple(int(d) for d in dims.group(1).split(",") if d) if dims else ())
    return shapes


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_minimal_remat_keeps_the_projections_and_recomputes_attention_scores(capsys, scan):
    """remat='minimal' keeps every weight product's output (the SwiGLU's [b, T, intermediate] ones)
    and no [.., T, .., T] attention score, where 'dots_saveable' keeps the scores and 'full' keeps
    neither; the gradients stay those of the model without remat."""
    config = ModelConfig.tiny_llama(num_hidden_layers=2, initializer_range=0.1, scan_layers=scan)
    length = 13  # no other dimension of the tiny model is 13
    ids = jnp.asarray(np.random.default_rng(0).integers(0, config.vocab_size, size=(2, length)))
    models = {remat: causal_lm_class(config)(config.replace(remat=remat), rngs=nnx.Rngs(0))
              for remat in ("none", "full", "minimal", "dots_saveable")}

    def scores(shapes):
        return [s for s in shapes if s.count(length) >= 2]

    def mlp(shapes):  # a product's output, its [2, T] token axes flattened (`layers.Linear`) or not
        return [s for s in shapes if s[-1:] == (config.intermediate_size,) and (length in s or 2 * length in s)]

    saved = {remat: _saved_residual_shapes(m, ids, capsys) for remat, m in models.items()}
    assert scores(saved["none"]) and scores(saved["dots_saveable"])
    assert not scores(saved["minimal"]) and not scores(saved["full"])
    assert mlp(saved["minimal"]) and not mlp(saved["full"])

    grad = nnx.jit(nnx.grad(_logsumexp_loss))
    expected = jax.tree.leaves(grad(models["none"], ids))
    got = jax.tree.leaves(grad(models["minimal"], ids))
    for a, b in zip(got, expected, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
