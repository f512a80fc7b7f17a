"""Attention over a decode cache read in blocks against a NumPy masked-softmax reference."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from intraskill_jax.models.layers import SharedKV, cached_attention


def reference(q, k, v, query_slots, key_valid, scale, shared=None):
    """q [B, T, H, D], k/v [B, KV, S, D]: softmax over the valid slots <= each query's slot, after a
    shared segment's first `length[b]` slots where `shared` = (key, value [KV, P, D], length [B]); NaN
    for a query with no own slot (padding, whose output nobody reads)."""
    b, t, h, d = q.shape
    kvh, s = k.shape[1], k.shape[2]
    out = np.full((b, t, h, d), np.nan)
    for row in range(b):
        first = 0 if shared is None else shared[2][row]
        for i in range(t):
            keys = [j for j in range(s) if key_valid[row, j] and j <= query_slots[row, i]]
            if query_slots[row, i] >= s or not keys:
                continue
            for head in range(h):
                kv = head // (h // kvh)
                kk, vv = k[row, kv, keys], v[row, kv, keys]
                if first:
                    kk = np.concatenate([shared[0][kv, :first], kk])
                    vv = np.concatenate([shared[1][kv, :first], vv])
                scores = kk @ q[row, i, head] * scale
                w = np.exp(scores - scores.max())
                out[row, i, head] = (w / w.sum()) @ vv
    return out


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("block_size", [0, 8, 16, 64])
@pytest.mark.parametrize("longest", [12, 39])
@pytest.mark.parametrize("group_rows", [None, 1, 2])
@pytest.mark.parametrize("devices", [1, 2])
@pytest.mark.parametrize("shared", [False, True])
def test_blocked_cache_attention_matches_reference(t, block_size, longest, group_rows, devices, shared):
    """Rows at different lengths (one idle: all its queries padding), holes in the valid slots, a
    cache of 40 slots that blocks of 16 do not divide (the last block overhangs), blocks larger
    than the cache, no blocks (one fused pass); the longest row short (a decode step loops over
    blocks) or near the end of the cache (a decode step reads it in one pass); several new tokens
    per row taken all rows at once, one row or two rows at a time (each group reading its own rows'
    blocks in use). On one device the head-major form, inside a mesh of two the per-block grouped
    one. With a shared segment of 21 slots that the rows attend to different lengths (none, part,
    all) before their own slots."""
    rng = np.random.default_rng(0)
    b, h, kvh, d, s = 4, 4, 2, 8, 40
    q = rng.normal(size=(b, t, h, d)).astype(np.float32)
    k = rng.normal(size=(b, kvh, s, d)).astype(np.float32)
    v = rng.normal(size=(b, kvh, s, d)).astype(np.float32)
    lengths = np.array([3, 7, longest - t, 0])  # slots written before this call
    query_slots = lengths[:, None] + np.arange(t)[None]
    query_slots[3] = s  # the idle row: out of range, writes and reads nothing
    query_slots[1, 0] = s  # a padded query inside a row
    key_valid = np.arange(s)[None] < (lengths + t)[:, None]
    key_valid[2, 1:4] = False  # slots of padding never written
    key_valid[3] = False
    segment = None
    if shared:
        segment = (rng.normal(size=(kvh, 21, d)).astype(np.float32), rng.normal(size=(kvh, 21, d)).astype(np.float32),
                   np.array([0, 13, 21, 5], np.int32))
    if group_rows and not block_size:
        pytest.skip("one fused pass takes every row at once")
    mesh = jax.make_mesh((devices,), ("data",), devices=jax.devices()[:devices])
    with jax.set_mesh(mesh) if devices > 1 else contextlib.nullcontext():
        got = np.asarray(cached_attention(jnp.asarray(q), jnp.asarray(k), jnp.asarray(v), jnp.asarray(query_slots),
                                          jnp.asarray(key_valid), block_size=block_size, scale=d**-0.5,
                                          score_bytes=group_rows and group_rows * h * t * min(block_size, s) * 4,
                                          shared=segment and SharedKV(*map(jnp.asarray, segment))))
    want = reference(q, k, v, query_slots, key_valid, d**-0.5, segment)
    real = ~np.isnan(want)
    assert real.sum() == h * d * (3 * t - 1) and np.isfinite(got).all()
    np.testing.assert_allclose(got[real], want[real], rtol=1e-5, atol=1e-5)


def test_bfloat16_products_over_the_cache_match_the_reference_to_their_precision():
    """The bfloat16 sampler's pre-fill multiplies queries, keys and probabilities in bfloat16 with
    float32 accumulation: within bfloat16's rounding of the reference, and not equal to float32's."""
    rng = np.random.default_rng(1)
    b, t, h, kvh, d, s = 2, 6, 4, 2, 16, 48
    q, k, v = (rng.normal(size=shape).astype(np.float32) for shape in ((b, t, h, d), (b, kvh, s, d), (b, kvh, s, d)))
    lengths = np.array([20, 41])
    query_slots = lengths[:, None] + np.arange(t)[None]
    key_valid = np.arange(s)[None] < (lengths + t)[:, None]
    args = [jnp.asarray(x) for x in (q, k, v, query_slots, key_valid)]
    want = reference(q, k, v, query_slots, key_valid, d**-0.5)
    f32 = np.asarray(cached_attention(*args, block_size=16, scale=d**-0.5))
    bf16 = np.asarray(cached_attention(*args, block_size=16, scale=d**-0.5, product_dtype=jnp.bfloat16))
    np.testing.assert_allclose(f32, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(bf16, want, rtol=0, atol=3e-2)
    assert np.abs(bf16 - want).max() > 1e-4  # the products did run in bfloat16
