"""Shared building blocks: parameters with logical axes, linear, embedding, norms, RoPE, MLP and
grouped-query attention (with the Qwen3.5 output gate as an option).

Every parameter is stored in the HuggingFace shape and layout (a linear's `weight` is
[out_features, in_features]) so that an NNX state path joined with '.' is the HF key. Every
parameter carries logical axis names (`out_sharding` metadata) from this vocabulary:
'vocab', 'embed', 'mlp', 'q_heads_dim', 'kv_heads_dim', 'linear_qkv', 'linear_z', 'linear_heads',
'conv_kernel', 'norm', or None (unsharded). `models/sharding.py` maps them to mesh axes.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax
import jax.numpy as jnp
from flax import nnx
from flax.core import spmd

from intraskill_jax.models import sharding
from intraskill_jax.models.config import RopeScaling

Axes = tuple[str | None, ...]


# --------------------------------------------------------------------------- sharding hooks
def param(value: jax.Array, axes: Axes) -> nnx.Param:
    """An `nnx.Param` annotated with logical axis names (`out_sharding` metadata).

    Flax shards at creation only when eager sharding is on *and* a mesh and logical axis rules are
    active; otherwise the names stay metadata that `models.sharding` turns into shardings.
    """
    eager = (
        nnx.using_eager_sharding()
        and bool(spmd.get_logical_axis_rules())
        and not jax.sharding.get_abstract_mesh().empty
    )
    return nnx.Param(value, out_sharding=tuple(axes), eager_sharding=eager)


def constrain(x: jax.Array, axes: Axes) -> jax.Array:
    """Activation sharding constraint by logical names; a no-op outside a mesh context."""
    return sharding.constrain(x, axes)


# --------------------------------------------------------------------------- basic layers
def matmul_dtype(compute: jnp.dtype, weight: jnp.dtype) -> jnp.dtype:
    """The dtype a product with a weight runs in: the narrower of the compute dtype and the weight's.

    A bfloat16 copy of float32 weights (the CPU sampler's, `SamplerConfig.weight_dtype`) multiplies
    in bfloat16 with float32 accumulation, while activations, norms and attention stay in float32:
    XLA:CPU runs bfloat16 products ~2x faster on AVX512-BF16 but its bfloat16 elementwise work and
    cache attention 5-8x slower (measured on SmolLM2's decode step).
    """
    compute, weight = jnp.dtype(compute), jnp.dtype(weight)
    return weight if weight.itemsize < compute.itemsize else compute


class Linear(nnx.Module):
    """y = x @ weight.T (+ bias) (+ lora_scale * lora(x)); weight [out_features, in_features] as in torch.

    `lora` is an optional `nnx.LoRA` adapter (`models/lora.py` adds it) beside the base weight, so
    the base keeps its HF key path.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        axes: Axes,
        use_bias: bool = False,
        dtype: jnp.dtype = jnp.float32,
        param_dtype: jnp.dtype = jnp.float32,
        init_std: float = 0.02,
        rngs: nnx.Rngs,
    ):
        self.dtype = dtype
        w = init_std * jax.random.normal(rngs.params(), (out_features, in_features), param_dtype)
        self.weight = param(w, axes)
        self.bias = param(jnp.zeros((out_features,), param_dtype), axes[:1]) if use_bias else None
        # `weight` as [in, out]: only on the sampler's model (`CausalLM.transpose_for_decode`).
        self.weight_t: nnx.Variable | None = None
        self.lora: nnx.LoRA | None = None
        self.lora_scale = 0.0

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x.astype(self.dtype)
        # On one device, products on [tokens, features]: with the leading axes flattened first,
        # XLA:CPU's gradients transpose a 2-D activation (a tiled copy) instead of looping over a
        # fused 3-D one (1.6x on SmolLM2's MLP forward + backward). On a mesh the axes stay apart.
        rows = x.reshape(-1, x.shape[-1]) if sharding.single_device() else x
        w, contract = (self.weight[...], 1) if self.weight_t is None else (self.weight_t[...], 0)
        dt = matmul_dtype(self.dtype, w.dtype)
        y = jax.lax.dot_general(rows.astype(dt), w.astype(dt), (((rows.ndim - 1,), (contract,)), ((), ())),
                                preferred_element_type=self.dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(self.dtype)
        if self.lora is not None:
            y = y + self.lora_scale * self.lora(rows)
        return y.reshape(*x.shape[:-1], y.shape[-1])


class Embedding(nnx.Module):
    """Token embedding, weight [vocab, hidden]; `attend` gives tied-head logits."""

    def __init__(
        self,
        num_embeddings: int,
        features: int,
        *,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        init_std: float = 0.02,
        rngs: nnx.Rngs,
    ):
        self.dtype = dtype
        w = init_std * jax.random.normal(rngs.params(), (num_embeddings, features), param_dtype)
        self.weight = param(w, ("vocab", "embed"))

    def __call__(self, ids: jax.Array) -> jax.Array:
        return jnp.take(self.weight[...], ids, axis=0).astype(self.dtype)


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis, in float32.

    zero_centered (Qwen3.5, Gemma-style): y = (x̂ · (1 + w)).astype(x.dtype), w initialised to 0.
    plain (Qwen3): y = w · x̂.astype(x.dtype), w initialised to 1.
    Here x̂ = x · rsqrt(mean(x²) + eps).
    """

    def __init__(
        self, dim: int, *, eps: float, zero_centered: bool, param_dtype: jnp.dtype = jnp.float32
    ):
        self.eps = eps
        self.zero_centered = zero_centered
        init = jnp.zeros if zero_centered else jnp.ones
        self.weight = param(init((dim,), param_dtype), ("norm",))

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        w = self.weight[...]
        if self.zero_centered:
            return (normed * (1.0 + w.astype(jnp.float32))).astype(x.dtype)
        return (w * normed.astype(x.dtype)).astype(x.dtype)


class GatedRMSNorm(nnx.Module):
    """Gated DeltaNet output norm ("norm before gate"), per head over the last axis.

    y = ((w · x̂.astype(x.dtype)) · silu(z in float32)).astype(x.dtype), w initialised to 1.
    """

    def __init__(self, dim: int, *, eps: float, param_dtype: jnp.dtype = jnp.float32):
        self.eps = eps
        self.weight = param(jnp.ones((dim,), param_dtype), ("norm",))

    def __call__(self, x: jax.Array, gate: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        y = self.weight[...] * normed.astype(x.dtype)
        return (y * jax.nn.silu(gate.astype(jnp.float32))).astype(x.dtype)


class MLP(nnx.Module):
    """SwiGLU: down(silu(gate(x)) · up(x)), biases only when `use_bias` (Llama's mlp_bias)."""

    def __init__(
        self,
        hidden: int,
        intermediate: int,
        *,
        use_bias: bool = False,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        init_std: float,
        rngs: nnx.Rngs,
    ):
        kw = {"use_bias": use_bias, "dtype": dtype, "param_dtype": param_dtype, "init_std": init_std, "rngs": rngs}
        self.gate_proj = Linear(hidden, intermediate, axes=("mlp", "embed"), **kw)
        self.up_proj = Linear(hidden, intermediate, axes=("mlp", "embed"), **kw)
        self.down_proj = Linear(intermediate, hidden, axes=("embed", "mlp"), **kw)

    def __call__(self, x: jax.Array) -> jax.Array:
        h = jax.nn.silu(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(constrain(h, ("batch", "seq", "mlp")))


# --------------------------------------------------------------------------- rotary embedding
def rope_cos_sin(
    positions: jax.Array, rotary_dim: int, theta: float, scaling: RopeScaling | None = None
) -> tuple[jax.Array, jax.Array]:
    """NeoX RoPE tables for integer positions [B, T]: cos, sin of shape [B, T, rotary_dim].

    inv_freq_j = theta^(-2j / rotary_dim), j < rotary_dim/2, duplicated to rotary_dim, then
    rescaled by a long-context checkpoint's `scaling`. With text-only inputs Qwen3.5's interleaved
    M-RoPE has three equal position rows and reduces to this.
    """
    inv_freq = 1.0 / (theta ** (jnp.arange(0, rotary_dim, 2, dtype=jnp.float32) / rotary_dim))
    if scaling is not None:
        inv_freq = scaling.scale(inv_freq)
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotates the first `cos.shape[-1]` dims of x [B, T, H, D] (rotate_half); the rest pass."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    half = rot // 2
    rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


# --------------------------------------------------------------------------- attention
def attention_mask(query_slots: jax.Array, key_valid: jax.Array) -> jax.Array:
    """Causal + padding mask [B, 1, T, S] from query slots ([T], or [B, T] per row) and key validity [B, S]."""
    key_slots = jnp.arange(key_valid.shape[1])
    query_slots = jnp.broadcast_to(query_slots, (key_valid.shape[0], query_slots.shape[-1]))
    causal = key_slots[None, None, :] <= query_slots[:, :, None]
    return (causal & key_valid[:, None, :].astype(bool))[:, None]


def _grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *, scale: float,
                       kv_layout: str = "bskd") -> jax.Array:
    """q [B, T, H, D], k/v [B, S, KV, D] ('bskd') or [B, KV, S, D] ('bksd'), mask broadcastable to
    [B, KV, G, T, S] -> [B, T, H, D]. Query heads are grouped onto their KV head, never repeated."""
    b, t, h, d = q.shape
    kvh = k.shape[kv_layout.index("k")]
    qg = q.reshape(b, t, kvh, h // kvh, d)
    scores = jnp.einsum(f"btkgd,{kv_layout}->bkgts", qg, k).astype(jnp.float32) * scale
    probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
    if kv_layout == "bksd" and t == 1:
        out = jnp.sum(probs[:, :, :, 0, :, None].astype(v.dtype) * v[:, :, None], axis=3)  # [B, KV, G, D]
        return out.reshape(b, 1, h, d)
    return jnp.einsum(f"bkgts,{kv_layout}->btkgd", probs.astype(v.dtype), v).reshape(b, t, h, d)


def blocked_causal_attention(
    q: jax.Array, k: jax.Array, v: jax.Array, key_valid: jax.Array, *, block_size: int, scale: float
) -> jax.Array:
    """Causal grouped-query attention over a whole sequence, one block of queries at a time.

    q [B, T, H, D], k/v [B, T, KV, D], key_valid [B, T] -> [B, T, H, D]. Query block i reads only
    keys [0, end of block i): the masked upper triangle is never computed (half the work of a
    full [T, T] score matrix) and each block's scores stay small. XLA's fused attention kernels
    on GPU/TPU do better; this is for backends without one (CPU), where it is ~3x faster.

    On one device the heads lead, once for all blocks: each block is then two products batched over
    (B, KV) with a KV head's query heads and the block's positions as one row axis, which XLA:CPU
    runs (and differentiates) without a transpose per block.
    """
    if not sharding.single_device():  # the per-block grouped form, which partitions as before
        outs = []
        for start in range(0, q.shape[1], block_size):
            end = min(start + block_size, q.shape[1])
            mask = attention_mask(jnp.arange(start, end), key_valid[:, :end])[:, :, None]
            outs.append(_grouped_attention(q[:, start:end], k[:, :end], v[:, :end], mask, scale=scale))
        return jnp.concatenate(outs, axis=1)
    b, t, h, d = q.shape
    kvh = k.shape[2]
    g = h // kvh
    qh = q.reshape(b, t, kvh, g, d).transpose(0, 2, 1, 3, 4)  # [B, KV, T, G, D]
    kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, KV, T, D]
    outs = []
    for start in range(0, t, block_size):
        end = min(start + block_size, t)
        rows = qh[:, :, start:end].reshape(b, kvh, (end - start) * g, d)
        scores = jnp.einsum("bkqd,bksd->bkqs", rows, kh[:, :, :end]).astype(jnp.float32) * scale
        mask = jnp.repeat(attention_mask(jnp.arange(start, end), key_valid[:, :end]), g, axis=2)  # [B, 1, rows, S]
        probs = jax.nn.softmax(jnp.where(mask, scores, jnp.finfo(jnp.float32).min), axis=-1)
        out = jnp.einsum("bkqs,bksd->bkqd", probs.astype(v.dtype), vh[:, :, :end])
        outs.append(out.reshape(b, kvh, end - start, g, d))
    return jnp.concatenate(outs, axis=2).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d)


# One cache block's scores for the rows a prefill onto the cache computes at once stay within this
# many bytes (`cached_attention`): in cache, rather than in memory at each pass of the softmax.
CACHE_BLOCK_SCORE_BYTES = 4 << 20


def cached_attention(q: jax.Array, key: jax.Array, value: jax.Array, query_slots: jax.Array, key_valid: jax.Array,
                     *, block_size: int, scale: float, score_bytes: int | None = None,
                     product_dtype: jnp.dtype = jnp.float32, shared: SharedKV | None = None) -> jax.Array:
    """Grouped-query attention of new tokens over a decode cache, reading only the slots in use.

    q [B, T, H, D]; key/value [B, KV, S, D] (the new tokens already written); query_slots [B, T]
    (out-of-range for padding); key_valid [B, S] -> [B, T, H, D], finite but meaningless for a query
    with no slot to attend (padding). No query attends past the highest slot a real query holds, so
    the cache is read in blocks of `block_size` slots up to that slot's block only (a loop with a
    data-dependent trip count, blocks combined by an online softmax): the step costs what the
    sessions hold, not what the cache has room for, and each block's scores stay small. On CPU at
    the quickstart's shapes (32 rows, 2,048 slots, ~900 in use) a turn's prefill of 256 tokens took
    280 instead of 780 ms. `block_size` 0 reads the whole cache in one fused pass.

    With several new tokens per row, the rows are taken a few at a time (a divisor of B), as many as
    keep one block's scores (rows x H x T x block_size floats) within `score_bytes` (default
    `CACHE_BLOCK_SCORE_BYTES`), each group reading only its own rows' blocks in use. At the
    quickstart's turn shapes (CPU; 32 rows of 128 queries over 1,024 of 2,048 slots, blocks of 512)
    all rows at once wrote 34 MB of scores per block, which each pass of the softmax read back from
    memory: 72 ms; four rows at a time, 40 ms. On one device such a call runs head-major, its
    products in `product_dtype` (`_head_major_cache_attention`); a decode step's stay float32.

    With `shared`, every row first attends the first `shared.length[b]` slots of a segment of keys
    and values that all rows share (a common prompt prefix, held once: `SharedKV`), and its own
    slots after them.
    """
    b, t, h, d = q.shape
    s = key.shape[2]

    def whole():
        if shared is None:
            return _grouped_attention(q, key, value, attention_mask(query_slots, key_valid)[:, :, None], scale=scale,
                                      kv_layout="bksd")
        return _whole_after_shared(q, key, value, query_slots, key_valid, shared, scale=scale)

    if not block_size:
        return whole()
    block_size = min(block_size, s)

    def blocked(q, key, value, query_slots, key_valid, num_blocks=None, shared=shared):
        if num_blocks is None:
            num_blocks = _blocks_in_use(query_slots, s, block_size)
        return _blocked_cache_attention(q, key, value, query_slots, key_valid, num_blocks, block_size=block_size,
                                        scale=scale, shared=shared)

    if t == 1:
        # A decode step's one fused pass reads a slot more cheaply than the block loop (CPU, quickstart
        # shapes: 2.2 against 3.5 ms per step with 900 of 1,024 slots in use before the additive mask;
        # 1.0-1.6x per slot with it), so the loop runs only when it reads less than half the cache.
        num_blocks = _blocks_in_use(query_slots, s, block_size)
        return jax.lax.cond(2 * num_blocks * block_size < s,
                            lambda: blocked(q, key, value, query_slots, key_valid, num_blocks), whole)
    fit = max(1, (score_bytes or CACHE_BLOCK_SCORE_BYTES) // (h * t * block_size * jnp.dtype(jnp.float32).itemsize))
    rows = max(r for r in range(1, b + 1) if b % r == 0 and r <= fit)
    if sharding.single_device():
        return _head_major_cache_attention(q, key, value, query_slots, key_valid, rows=rows, block_size=block_size,
                                           scale=scale, product_dtype=product_dtype, shared=shared)
    if rows == b:
        return blocked(q, key, value, query_slots, key_valid)

    def group(i, out):
        def take(x):
            return jax.lax.dynamic_slice_in_dim(x, i * rows, rows, axis=0)

        part = blocked(take(q), take(key), take(value), take(query_slots), take(key_valid),
                       shared=None if shared is None else shared.rows(take))
        return jax.lax.dynamic_update_slice_in_dim(out, part, i * rows, axis=0)

    return jax.lax.fori_loop(0, b // rows, group, jnp.zeros_like(q))


@flax.struct.dataclass
class SharedKV:
    """A segment of keys and values every row of a cache may attend before its own slots: the state
    of a prompt prefix the rows share, held once instead of in each row. A decode step of B rows
    then reads it once, as one product of all rows' queries (SmolLM2 with S0 at 32 rows: a 841-token
    head of ~1,400 cached tokens that each row would otherwise hold and read on its own)."""

    key: jax.Array  # [KV, P, D]
    value: jax.Array  # [KV, P, D]
    length: jax.Array  # [B] int32: the segment's first slots each row attends (0: none)

    def rows(self, take: Callable[[jax.Array], jax.Array]) -> SharedKV:
        """The same segment for the rows `take` selects of `length`."""
        return self.replace(length=take(self.length))


def _shared_blocks(carry: tuple[jax.Array, jax.Array, jax.Array], shared: SharedKV, block_size: int,
                   scores: Callable[[jax.Array, jax.Array], jax.Array],
                   weigh: Callable[[jax.Array, jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Continues an online softmax over a shared segment's slots the rows attend, in blocks of
    `block_size` (0: the whole segment at once), up to the longest row's: `scores(k, bias)` are the
    rows' scores against a block's keys [KV, block, D] with the additive mask `bias` [rows, block],
    `weigh(p, v)` the block's values weighted by the unnormalised probabilities."""
    p = shared.key.shape[1]
    block_size = min(block_size or p, p)
    neg = jnp.finfo(jnp.float32).min

    def body(i, carry):
        start = jnp.minimum(i * block_size, p - block_size)  # an overhanging last block: as `_block_bias`
        k = jax.lax.dynamic_slice_in_dim(shared.key, start, block_size, axis=1)
        v = jax.lax.dynamic_slice_in_dim(shared.value, start, block_size, axis=1)
        slots = start + jnp.arange(block_size)
        bias = jnp.where((slots >= i * block_size)[None] & (slots[None] < shared.length[:, None]), 0.0, neg)
        return _online_softmax(carry, scores(k, bias), lambda probs: weigh(probs, v))

    return jax.lax.fori_loop(0, (jnp.max(shared.length) + block_size - 1) // block_size, body, carry)


def _whole_after_shared(q: jax.Array, key: jax.Array, value: jax.Array, query_slots: jax.Array,
                        key_valid: jax.Array, shared: SharedKV, *, scale: float) -> jax.Array:
    """`cached_attention` in one pass over the whole segment and the whole cache: one softmax over
    the scores of both."""
    b, t, h, d = q.shape
    kvh = key.shape[1]
    qg = (q.astype(jnp.float32) * scale).reshape(b, t, kvh, h // kvh, d)
    neg = jnp.finfo(jnp.float32).min
    attended = jnp.arange(shared.key.shape[1])[None] < shared.length[:, None]  # [B, P]
    seg = (jnp.einsum("btkgd,ksd->bkgts", qg, shared.key.astype(jnp.float32))
           + jnp.where(attended, 0.0, neg)[:, None, None, None])
    own = (jnp.einsum("btkgd,bksd->bkgts", qg, key.astype(jnp.float32))
           + jnp.where(attention_mask(query_slots, key_valid), 0.0, neg)[:, :, None])
    m = jnp.maximum(jnp.max(seg, axis=-1), jnp.max(own, axis=-1))[..., None]
    seg, own = jnp.exp(seg - m), jnp.exp(own - m)
    acc = (jnp.einsum("bkgts,ksd->bkgtd", seg, shared.value.astype(jnp.float32))
           + jnp.einsum("bkgts,bksd->bkgtd", own, value.astype(jnp.float32)))
    out = acc / jnp.maximum(jnp.sum(seg, axis=-1) + jnp.sum(own, axis=-1), jnp.finfo(jnp.float32).tiny)[..., None]
    return jnp.moveaxis(out, 3, 1).reshape(b, t, h, d).astype(q.dtype)


def _blocks_in_use(query_slots: jax.Array, s: int, block_size: int) -> jax.Array:
    """Blocks of `block_size` slots up to the highest slot a real query (slot < s) holds."""
    live = jnp.max(jnp.where(query_slots < s, query_slots, -1)) + 1
    return (live + block_size - 1) // block_size


def _block_bias(i: jax.Array, start: jax.Array, block_size: int, query_slots: jax.Array,
                valid: jax.Array) -> jax.Array:
    """The additive mask [B, T, block] of cache block `i`, read from slot `start` (before i * block_size
    where the last block overhangs the cache: the slots an earlier block counted are masked).

    Masked slots get the lowest float added (XLA:CPU fuses the addition into the product; selecting
    instead materialised the block's scores once more, ~1.4x slower at the quickstart's turn
    shapes). A real query holds slot 0 of its row, so block 0 gives it a finite maximum and every
    masked slot then weighs exp(~-3e38) = 0; a padding query, with no slot at all, weighs every slot
    alike and stays finite."""
    slots = start + jnp.arange(block_size)
    mask = ((slots >= i * block_size)[None, None, :] & (slots[None, None, :] <= query_slots[:, :, None])
            & valid[:, None, :])
    return jnp.where(mask, 0.0, jnp.finfo(jnp.float32).min)


def _online_softmax(carry: tuple[jax.Array, jax.Array, jax.Array], scores: jax.Array,
                    weigh: Callable[[jax.Array], jax.Array]) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One block of an online softmax: (running max, normaliser, weighted values) updated with the
    block's `scores` [..., block]; `weigh(p)` is the block's values weighted by its unnormalised
    probabilities."""
    m, l, acc = carry
    m_new = jnp.maximum(m, jnp.max(scores, axis=-1))
    p = jnp.exp(scores - m_new[..., None])
    corr = jnp.exp(m - m_new)
    return m_new, l * corr + jnp.sum(p, axis=-1), acc * corr[..., None] + weigh(p)


def _blocked_cache_attention(q: jax.Array, key: jax.Array, value: jax.Array, query_slots: jax.Array,
                             key_valid: jax.Array, num_blocks: jax.Array, *, block_size: int,
                             scale: float, shared: SharedKV | None = None) -> jax.Array:
    """`cached_attention` over its first `num_blocks` blocks (`_blocks_in_use`), after the `shared`
    segment's, combined by an online softmax; block_size <= S."""
    b, t, h, d = q.shape
    kvh, s = key.shape[1], key.shape[2]
    g = h // kvh
    qg = (q.astype(jnp.float32) * scale).reshape(b, t, kvh, g, d)
    neg = jnp.finfo(jnp.float32).min

    def body(i, carry):
        # The last block may overhang the cache: read the final `block_size` slots instead and
        # mask those an earlier block already counted.
        start = jnp.minimum(i * block_size, s - block_size)
        k = jax.lax.dynamic_slice_in_dim(key, start, block_size, axis=2).astype(jnp.float32)
        v = jax.lax.dynamic_slice_in_dim(value, start, block_size, axis=2).astype(jnp.float32)
        valid = jax.lax.dynamic_slice_in_dim(key_valid, start, block_size, axis=1)
        bias = _block_bias(i, start, block_size, query_slots, valid)[:, None, None]  # [B, 1, 1, T, block]
        scores = jnp.einsum("btkgd,bksd->bkgts", qg, k) + bias
        if t == 1:
            return _online_softmax(carry, scores, lambda p: jnp.sum(p[:, :, :, 0, :, None] * v[:, :, None],
                                                                    axis=3)[:, :, :, None])
        return _online_softmax(carry, scores, lambda p: jnp.einsum("bkgts,bksd->bkgtd", p, v))

    init = (jnp.full((b, kvh, g, t), neg, jnp.float32), jnp.zeros((b, kvh, g, t), jnp.float32),
            jnp.zeros((b, kvh, g, t, d), jnp.float32))
    if shared is not None:  # one product of every row's queries per block of the segment
        init = _shared_blocks(
            init, shared, block_size,
            lambda k, bias: jnp.einsum("btkgd,ksd->bkgts", qg, k.astype(jnp.float32)) + bias[:, None, None, None],
            lambda p, v: jnp.einsum("bkgts,ksd->bkgtd", p, v.astype(jnp.float32)))
    _, l, acc = jax.lax.fori_loop(0, num_blocks, body, init)
    out = acc / jnp.maximum(l, jnp.finfo(jnp.float32).tiny)[..., None]
    return jnp.moveaxis(out, 3, 1).reshape(b, t, h, d).astype(q.dtype)


def _head_major_cache_attention(q: jax.Array, key: jax.Array, value: jax.Array, query_slots: jax.Array,
                                key_valid: jax.Array, *, rows: int, block_size: int, scale: float,
                                product_dtype: jnp.dtype = jnp.float32, shared: SharedKV | None = None) -> jax.Array:
    """`cached_attention` of several new tokens per row on one device: `rows` rows at a time (a
    divisor of B), each group over its own blocks in use, combined by an online softmax.

    The heads lead, once for all blocks: a block is then two products batched over (rows, KV), a
    KV head's query heads and the new tokens as one row axis, and its keys and values are sliced
    straight from the cache, which already holds them head-major. The 5-D per-block products of
    `_blocked_cache_attention`, with each group's rows copied out of the cache first, ran a turn's
    pre-fill of SmolLM2 (32 rows x 128 new tokens over ~1,300 of 2,048 slots) in 9.9 s; this in 6.0 s
    (blocks of 256), nearly all of it the products, and in 5.6 s with `product_dtype` bfloat16 (the
    queries, keys, values and probabilities rounded for the products, float32 accumulation and
    softmax): each key is read by T x G queries, so converting a block costs little.
    """
    b, t, h, d = q.shape
    kvh, s = key.shape[1], key.shape[2]
    g = h // kvh
    qh = (q.astype(jnp.float32) * scale).reshape(b, t, kvh, g, d).transpose(0, 2, 1, 3, 4).reshape(b, kvh, t * g, d)
    qh = qh.astype(product_dtype)
    neg = jnp.finfo(jnp.float32).min

    def product(spec, x, y):
        return jnp.einsum(spec, x.astype(product_dtype), y.astype(product_dtype), preferred_element_type=jnp.float32)

    def group(r, out):
        first = r * rows
        slots_in = jax.lax.dynamic_slice_in_dim(query_slots, first, rows)
        qr = jax.lax.dynamic_slice_in_dim(qh, first, rows)

        def body(i, carry):
            # An overhanging last block reads the final `block_size` slots; those counted before are masked.
            start = jnp.minimum(i * block_size, s - block_size)
            k = jax.lax.dynamic_slice(key, (first, 0, start, 0), (rows, kvh, block_size, d))
            v = jax.lax.dynamic_slice(value, (first, 0, start, 0), (rows, kvh, block_size, d))
            valid = jax.lax.dynamic_slice(key_valid, (first, start), (rows, block_size))
            bias = jnp.repeat(_block_bias(i, start, block_size, slots_in, valid), g, axis=1)  # one row per query head
            scores = product("bkqd,bksd->bkqs", qr, k) + bias[:, None]  # [rows, KV, T*G, block]
            return _online_softmax(carry, scores, lambda p: product("bkqs,bksd->bkqd", p, v))

        init = (jnp.full((rows, kvh, t * g), neg, jnp.float32), jnp.zeros((rows, kvh, t * g), jnp.float32),
                jnp.zeros((rows, kvh, t * g, d), jnp.float32))
        if shared is not None:
            init = _shared_blocks(init, shared.rows(lambda x: jax.lax.dynamic_slice_in_dim(x, first, rows)),
                                  block_size, lambda k, bias: product("bkqd,ksd->bkqs", qr, k) + bias[:, None, None],
                                  lambda p, v: product("bkqs,ksd->bkqd", p, v))
        _, l, acc = jax.lax.fori_loop(0, _blocks_in_use(slots_in, s, block_size), body, init)
        part = acc / jnp.maximum(l, jnp.finfo(jnp.float32).tiny)[..., None]
        return jax.lax.dynamic_update_slice_in_dim(out, part, first, axis=0)

    out = jax.lax.fori_loop(0, b // rows, group, jnp.zeros((b, kvh, t * g, d), jnp.float32))
    return out.reshape(b, kvh, t, g, d).transpose(0, 2, 1, 3, 4).reshape(b, t, h, d).astype(q.dtype)


class Attention(nnx.Module):
    """Grouped-query softmax attention with (partial) RoPE, q/k RMSNorm when `qk_norm` (Qwen).

    With `output_gate` (Qwen3.5), q_proj emits per head [query (D) | gate (D)] and the attention
    output is multiplied by sigmoid(gate) before o_proj.
    """

    def __init__(
        self,
        *,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        output_gate: bool,
        zero_centered_norm: bool,
        qk_norm: bool = True,
        eps: float,
        use_bias: bool,
        dtype: jnp.dtype,
        param_dtype: jnp.dtype,
        init_std: float,
        rngs: nnx.Rngs,
        block_size: int = 0,
        cache_block_size: int = 0,
        cache_product_dtype: jnp.dtype | None = None,
    ):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.block_size, self.cache_block_size = block_size, cache_block_size
        # A pre-fill's products over the cache run in the weights' dtype where that is narrower
        # (the bfloat16 sampler's) unless told otherwise (`cached_attention`).
        self.cache_product_dtype = (matmul_dtype(dtype, param_dtype) if cache_product_dtype is None
                                    else jnp.dtype(cache_product_dtype))
        self.output_gate = output_gate
        self.dtype = dtype
        kw = {
            "use_bias": use_bias,
            "dtype": dtype,
            "param_dtype": param_dtype,
            "init_std": init_std,
            "rngs": rngs,
        }
        q_out = num_heads * head_dim * (2 if output_gate else 1)
        self.q_proj = Linear(hidden, q_out, axes=("q_heads_dim", "embed"), **kw)
        self.k_proj = Linear(hidden, num_kv_heads * head_dim, axes=("kv_heads_dim", "embed"), **kw)
        self.v_proj = Linear(hidden, num_kv_heads * head_dim, axes=("kv_heads_dim", "embed"), **kw)
        self.o_proj = Linear(num_heads * head_dim, hidden, axes=("embed", "q_heads_dim"), **kw)
        norm_kw = {"eps": eps, "zero_centered": zero_centered_norm, "param_dtype": param_dtype}
        self.q_norm = RMSNorm(head_dim, **norm_kw) if qk_norm else None
        self.k_norm = RMSNorm(head_dim, **norm_kw) if qk_norm else None

    def __call__(
        self,
        x: jax.Array,
        cos: jax.Array,
        sin: jax.Array,
        *,
        key_valid: jax.Array,
        kv_cache: tuple[jax.Array, jax.Array] | None = None,
        query_slots: jax.Array | None = None,
        shared: SharedKV | None = None,
    ) -> tuple[jax.Array, tuple[jax.Array, jax.Array] | None]:
        """Args:
          x: [B, T, hidden]; cos, sin: [B, T, rotary_dim].
          key_valid: [B, S] bool, which key slots hold real tokens (S = T without a cache, else
            the cache length, already updated for the new tokens).
          kv_cache: (key, value) [B, KV, S, D] or None.
          query_slots: [B, T] cache slot of each new token (its key and value are written there;
            an out-of-range slot, for padding, writes nothing); with a cache only.
          shared: keys and values of a prefix the rows share, attended before the cache's; with a
            cache only.
        Returns:
          [B, T, hidden] and the updated (key, value) cache (None without one).
        """
        b, t, _ = x.shape
        h, kvh, d = self.num_heads, self.num_kv_heads, self.head_dim
        q = self.q_proj(x)
        if self.output_gate:
            q = q.reshape(b, t, h, 2 * d)
            q, gate = q[..., :d], q[..., d:].reshape(b, t, h * d)
        else:
            q, gate = q.reshape(b, t, h, d), None
        k = self.k_proj(x).reshape(b, t, kvh, d)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        v = self.v_proj(x).reshape(b, t, kvh, d)
        q = constrain(q, ("batch", "seq", "heads", None))

        new_cache = None
        if kv_cache is not None:  # [B, KV, S, D]; the indexed [B, T] lead, as in k [B, T, KV, D]
            rows = jnp.arange(b)[:, None]
            new_cache = (kv_cache[0].at[rows, :, query_slots].set(k.astype(kv_cache[0].dtype), mode="drop"),
                         kv_cache[1].at[rows, :, query_slots].set(v.astype(kv_cache[1].dtype), mode="drop"))
            out = cached_attention(q.astype(self.dtype), new_cache[0].astype(self.dtype),
                                   new_cache[1].astype(self.dtype), query_slots, key_valid,
                                   block_size=self.cache_block_size, scale=d**-0.5,
                                   product_dtype=self.cache_product_dtype, shared=shared)
        elif 0 < self.block_size < t:
            out = blocked_causal_attention(q.astype(self.dtype), k.astype(self.dtype), v.astype(self.dtype),
                                           key_valid, block_size=self.block_size, scale=d**-0.5)
        else:
            out = jax.nn.dot_product_attention(q.astype(self.dtype), k.astype(self.dtype), v.astype(self.dtype),
                                               mask=attention_mask(jnp.arange(t), key_valid), scale=d**-0.5)
        out = out.reshape(b, t, h * d)
        if gate is not None:
            out = out * jax.nn.sigmoid(gate)
        return self.o_proj(out), new_cache
