"""Text-model configuration: one frozen dataclass, `ModelConfig`, for every model family.

Its architecture fields carry the HuggingFace names (`hidden_size`, `linear_num_value_heads`, ...)
so a reader can match each one to `config.json`. `family` names the registered family that owns
the rest (what it fixes in the decoder stack, its config.json conversion, model class and key map);
this module knows no family: `models/families.py` is the one place that does, and converts
config.json both ways (`config_from_hf`, `hf_config`) with the fields every family reads and writes
alike (`hf_text_fields`, `hf_text_dict` here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

LayerType = Literal["linear_attention", "full_attention"]
DType = Literal["float32", "bfloat16"]
RematPolicy = Literal["none", "full", "minimal", "dots_saveable"]

_LAYER_TYPES = ("linear_attention", "full_attention")
_DTYPES = ("float32", "bfloat16")
_REMAT = ("none", "full", "minimal", "dots_saveable")
# The Gated DeltaNet sizes, required once a layer is 'linear_attention'.
LINEAR_ATTENTION_FIELDS = (
    "linear_num_key_heads",
    "linear_num_value_heads",
    "linear_key_head_dim",
    "linear_value_head_dim",
    "linear_conv_kernel_dim",
)


def default_dtype() -> DType:
    """float32 on CPU (tests, parity), bfloat16 on accelerators."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


RopeType = Literal["linear", "llama3"]
ROPE_TYPES: tuple[str, ...] = ("linear", "llama3")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RopeScaling:
    """RoPE frequency scaling of a long-context checkpoint (config.json `rope_parameters` /
    `rope_scaling`); plain RoPE has none (`ModelConfig.rope_scaling` None).

    Attributes:
      rope_type: 'linear' (every frequency / factor) or 'llama3' (Llama 3.1+: wavelengths longer
        than original_max_position_embeddings / low_freq_factor are divided by factor, shorter
        than .../high_freq_factor kept, those between interpolated smoothly).
      factor, low_freq_factor, high_freq_factor, original_max_position_embeddings: as in HF.
    """

    rope_type: RopeType
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not supported; built: 'default', {ROPE_TYPES}.")
        if not self.factor > 0:
            raise ValueError(f"rope scaling factor must be > 0; got {self.factor}.")
        if self.rope_type == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(f"llama3 RoPE needs high_freq_factor > low_freq_factor > 0; got "
                             f"{self.high_freq_factor}, {self.low_freq_factor}.")

    def scale(self, inv_freq: jax.Array) -> jax.Array:
        """The scaled inverse frequencies [rotary_dim / 2] of plain RoPE's `inv_freq`."""
        if self.rope_type == "linear":
            return inv_freq / self.factor
        wavelength = 2 * math.pi / inv_freq
        long_wave = self.original_max_position_embeddings / self.low_freq_factor
        short_wave = self.original_max_position_embeddings / self.high_freq_factor
        # 0 at the long-wavelength end (fully scaled) to 1 at the short end (kept), linear in
        # context / wavelength between them.
        smooth = (self.original_max_position_embeddings / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        between = (1 - smooth) * inv_freq / self.factor + smooth * inv_freq
        return jnp.where(wavelength > long_wave, inv_freq / self.factor,
                         jnp.where(wavelength < short_wave, inv_freq, between))

    def to_hf(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rope_type": self.rope_type, "factor": self.factor}
        if self.rope_type == "llama3":
            out.update(low_freq_factor=self.low_freq_factor, high_freq_factor=self.high_freq_factor,
                       original_max_position_embeddings=self.original_max_position_embeddings)
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture and numerics of a text model of a registered family.

    Attributes:
      family: a name in `models/families.py` ('qwen3_5': zero-centred (1+w) norms, gated
        attention, partial RoPE, Gated DeltaNet layers; 'qwen3': plain w norms, no output gate,
        full RoPE, attention only; 'llama': as qwen3 without q/k norms). Its `Architecture` fixes
        what the sizes below do not; the family is checked when its model is built.
      vocab_size .. rms_norm_eps: as in HF `config.json`.
      rope_theta: `rope_parameters.rope_theta` (or legacy top-level `rope_theta`).
      rope_scaling: long-context RoPE scaling (`RopeScaling`); None: plain RoPE.
      partial_rotary_factor: fraction of head_dim that is rotated (Qwen3.5: 0.25).
      layer_types: one of 'linear_attention' / 'full_attention' per layer (`layer_pattern` builds
        the hybrid one); the presets and each family's config.json reader fill it in.
      linear_*: Gated DeltaNet sizes (ignored when no layer is 'linear_attention').
      tie_word_embeddings: when true there is no `lm_head.weight`; logits use the embedding.
      attention_bias: biases on q/k/v/o projections (HF field; false for released models).
      mlp_bias: biases on the MLP's projections (Llama's HF field; false for released models).
      pad_token_id, eos_token_ids: token ids the sampler needs (all EOS ids seen in the config).
      dtype: compute dtype (activations and matmul inputs).
      param_dtype: storage dtype of parameters.
      remat: per-decoder-layer rematerialization: 'none', 'full' (save only layer inputs),
        'minimal' (MaxText's name: keep the weight products' outputs, recompute attention's
        batched products and the elementwise work, so the backward never holds a layer's
        attention scores) or 'dots_saveable' (keep every matmul output, attention scores
        included); scanned layers too.
      scan_layers: without a decode cache (training, log-prob passes) run the layers as one
        `lax.scan` over repeats of the layer pattern's period (`layer_period`), so a jitted
        program traces and compiles one period instead of every layer; the parameters stay one
        module per layer. The sampler's cached path stays unrolled. Needs a pattern whose period
        divides num_hidden_layers.
      gdn_chunk_size: chunk length of the chunked Gated DeltaNet kernel (prefill / training).
      logits_chunk_size: sequence chunk used by `token_logprobs` to avoid full-vocab logits.
      attention_block_size: 0 (default) computes whole-sequence attention with
        `jax.nn.dot_product_attention` (fused kernels on GPU/TPU); N > 0 computes it N queries at
        a time, skipping the masked upper triangle (faster on CPU, which has no fused kernel).
      cache_block_size: 0 (default) reads every slot of a decode cache at each step (one fused
        einsum); N > 0 reads it N slots at a time up to the last slot in use, so a step costs
        what the sessions hold rather than the cache's size (CPU, where the read is the step).
      transpose_decode_weights: the sampler multiplies by [in, out] copies of the linear and output
        weights, made once per weight version (`CausalLM.transpose_for_decode`): ~1.4x faster
        decode steps on CPU; on GPU/TPU it would only double the sampler's weight memory.
      cache_product_dtype: the dtype a pre-fill's products over the decode cache round their
        operands to (`layers.cached_attention`); None (default): the narrower of dtype and
        param_dtype, i.e. bfloat16 for the bfloat16 sampler. The sampler sets float32 on a CPU
        whose XLA cannot run them (`rollout.jax_sampler.for_sampling`).
    """

    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
    rope_scaling: RopeScaling | None = None
    partial_rotary_factor: float = 1.0
    max_position_embeddings: int = 32768
    layer_types: tuple[LayerType, ...] = ()
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel_dim: int = 0
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: DType = dataclasses.field(default_factory=default_dtype)
    param_dtype: DType = dataclasses.field(default_factory=default_dtype)
    remat: RematPolicy = "none"
    scan_layers: bool = False
    gdn_chunk_size: int = 64
    logits_chunk_size: int = 512
    attention_block_size: int = 0
    cache_block_size: int = 0
    transpose_decode_weights: bool = False
    cache_product_dtype: DType | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            raise ValueError(
                "ModelConfig.layer_types is empty; give one type per layer (all 'full_attention' for "
                "an attention-only family, models.config.layer_pattern for the hybrid one), or build "
                "the config with a preset or from a config.json (models.families.config_from_hf).")
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        if isinstance(self.rope_scaling, Mapping):
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        object.__setattr__(self, "eos_token_ids", tuple(int(e) for e in self.eos_token_ids))
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "gdn_chunk_size",
            "logits_chunk_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"ModelConfig.{name} must be a positive int; got {value!r}.")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads}) for grouped-query attention."
            )
        if len(self.layer_types) != self.num_hidden_layers:
            raise ValueError(
                f"layer_types has {len(self.layer_types)} entries but num_hidden_layers is "
                f"{self.num_hidden_layers}; give one type per layer."
            )
        bad = sorted({t for t in self.layer_types if t not in _LAYER_TYPES})
        if bad:
            raise ValueError(f"Unsupported layer_types {bad}; supported: {list(_LAYER_TYPES)}.")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1]; got {self.partial_rotary_factor}."
            )
        if self.rotary_dim % 2:
            raise ValueError(
                f"rotary dim int(head_dim * partial_rotary_factor) = {self.rotary_dim} must be even."
            )
        if self.has_linear_attention:
            for name in LINEAR_ATTENTION_FIELDS:
                value = getattr(self, name)
                if not isinstance(value, int) or value <= 0:
                    raise ValueError(
                        f"ModelConfig.{name} must be a positive int when layers use linear "
                        f"attention; got {value!r}."
                    )
            if self.linear_num_value_heads % self.linear_num_key_heads:
                raise ValueError(
                    f"linear_num_value_heads ({self.linear_num_value_heads}) must be a multiple of "
                    f"linear_num_key_heads ({self.linear_num_key_heads})."
                )
        if self.dtype not in _DTYPES or self.param_dtype not in _DTYPES:
            raise ValueError(
                f"dtype and param_dtype must be one of {_DTYPES}; got {self.dtype!r}, "
                f"{self.param_dtype!r}."
            )
        if self.cache_product_dtype not in (None, *_DTYPES):
            raise ValueError(
                f"cache_product_dtype must be None or one of {_DTYPES}; got {self.cache_product_dtype!r}."
            )
        for name in ("attention_block_size", "cache_block_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"ModelConfig.{name} must be an int >= 0; got {value!r}.")
        if not isinstance(self.transpose_decode_weights, bool):
            raise ValueError(
                "ModelConfig.transpose_decode_weights must be a bool; "
                f"got {self.transpose_decode_weights!r}."
            )
        if self.remat not in _REMAT:
            raise ValueError(f"remat must be one of {_REMAT}; got {self.remat!r}.")
        if self.scan_layers and self.num_hidden_layers % self.layer_period:
            raise ValueError(
                f"scan_layers needs a layer pattern that repeats with a period dividing "
                f"num_hidden_layers ({self.num_hidden_layers}); layer_types {list(self.layer_types)} "
                f"repeats every {self.layer_period} layers. Set scan_layers=False "
                "(policy.scan_layers=False in a run config) or give whole repeats of the pattern."
            )

    # ----------------------------------------------------------------- derived values
    @property
    def has_linear_attention(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def layer_period(self) -> int:
        """The smallest p with layer_types[i] == layer_types[i + p] for every layer (Qwen3.5: 4,
        attention-only: 1); the stack is whole repeats of it when p divides num_hidden_layers."""
        types, n = self.layer_types, len(self.layer_types)
        return next(p for p in range(1, n + 1) if types[p:] == types[: n - p])

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        return jnp.dtype(self.param_dtype)

    @property
    def linear_conv_dim(self) -> int:
        """Channels of the DeltaNet depthwise conv: [Q | K | V] = 2·Hk·Dk + Hv·Dv."""
        return (
            2 * self.linear_num_key_heads * self.linear_key_head_dim
            + self.linear_num_value_heads * self.linear_value_head_dim
        )

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    # ----------------------------------------------------------------- presets
    @classmethod
    def _preset(cls, base: Mapping[str, Any], overrides: Mapping[str, Any], *,
                full_attention_interval: int) -> ModelConfig:
        """`base` under `overrides`, with the family's layer pattern over however many layers
        that gives, unless `overrides` names the layer types."""
        fields = {**base, **overrides}
        fields.setdefault("layer_types", layer_pattern(fields["num_hidden_layers"], full_attention_interval))
        return cls(**fields)

    @classmethod
    def tiny_qwen3_5(cls, **overrides: Any) -> ModelConfig:
        """4 layers (3 DeltaNet + 1 attention), Hv > Hk; for tests."""
        base = {
            "family": "qwen3_5",
            "vocab_size": 300,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_theta": 10_000.0,
            "partial_rotary_factor": 0.25,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 8,
            "linear_conv_kernel_dim": 4,
            "tie_word_embeddings": False,
            "dtype": "float32",
            "param_dtype": "float32",
        }
        return cls._preset(base, overrides, full_attention_interval=4)

    @classmethod
    def tiny_qwen3(cls, **overrides: Any) -> ModelConfig:
        """2 dense layers; for tests."""
        base = {
            "family": "qwen3",
            "vocab_size": 300,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rope_theta": 1_000_000.0,
            "tie_word_embeddings": True,
            "dtype": "float32",
            "param_dtype": "float32",
        }
        return cls._preset(base, overrides, full_attention_interval=1)

    @classmethod
    def qwen3_5_4b(cls, **overrides: Any) -> ModelConfig:
        """The Qwen3.5-4B text model's architecture (its config.json); weights come from the checkpoint."""
        base = {
            "family": "qwen3_5",
            "vocab_size": 248320,
            "hidden_size": 2560,
            "intermediate_size": 9216,
            "num_hidden_layers": 32,
            "num_attention_heads": 16,
            "num_key_value_heads": 4,
            "head_dim": 256,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.25,
            "max_position_embeddings": 262144,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "tie_word_embeddings": True,
            "pad_token_id": 248044,
            "eos_token_ids": (248046, 248044),
        }
        return cls._preset(base, overrides, full_attention_interval=4)

    @classmethod
    def qwen3_4b(cls, **overrides: Any) -> ModelConfig:
        """Qwen3-4B dense (its HF config.json); weights come from the checkpoint."""
        base = {
            "family": "qwen3",
            "vocab_size": 151936,
            "hidden_size": 2560,
            "intermediate_size": 9728,
            "num_hidden_layers": 36,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "head_dim": 128,
            "rms_norm_eps": 1e-6,
            "rope_theta": 1_000_000.0,
            "max_position_embeddings": 40960,
            "tie_word_embeddings": True,
            "pad_token_id": 151643,
            "eos_token_ids": (151645, 151643),
        }
        return cls._preset(base, overrides, full_attention_interval=1)

    @classmethod
    def tiny_llama(cls, **overrides: Any) -> ModelConfig:
        """2 Llama layers (no q/k norms), untied head; for tests."""
        base = {
            "family": "llama",
            "vocab_size": 300,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100_000.0,
            "tie_word_embeddings": False,
            "dtype": "float32",
            "param_dtype": "float32",
        }
        return cls._preset(base, overrides, full_attention_interval=1)

    @classmethod
    def smollm2_135m(cls, **overrides: Any) -> ModelConfig:
        """SmolLM2-135M(-Instruct), Llama architecture (its config.json and the registry's GGUF);
        weights come from the checkpoint (`intraskill fetch-model smollm2-135m-instruct`)."""
        base = {
            "family": "llama",
            "vocab_size": 49152,
            "hidden_size": 576,
            "intermediate_size": 1536,
            "num_hidden_layers": 30,
            "num_attention_heads": 9,
            "num_key_value_heads": 3,
            "head_dim": 64,
            "rms_norm_eps": 1e-5,
            "rope_theta": 100_000.0,
            "max_position_embeddings": 8192,
            "tie_word_embeddings": True,
            "pad_token_id": 2,
            "eos_token_ids": (2,),
        }
        return cls._preset(base, overrides, full_attention_interval=1)


def layer_pattern(num_layers: int, full_attention_interval: int) -> tuple[LayerType, ...]:
    """Every `full_attention_interval`-th layer (3, 7, ... for 4) is full attention, the rest linear
    (1: every layer is full attention)."""
    return tuple(
        "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
        for i in range(num_layers)
    )


def hf_field(hf: Mapping[str, Any], key: str, model_type: str) -> Any:
    """A field config.json must have; a clear error naming it when it is absent."""
    if key not in hf:
        raise ValueError(f"HF config ({model_type}) lacks required field {key!r}.")
    return hf[key]


def hf_text_fields(
    text: Mapping[str, Any],
    top: Mapping[str, Any],
    *,
    model_type: str,
    partial_rotary_factor: float,
) -> dict[str, Any]:
    """The `ModelConfig` fields every family reads alike from its text config `text`.

    `top` is the whole config.json: a multimodal wrapper (text model under `text_config`) or
    `text` itself. `partial_rotary_factor` is the family's value when config.json names none.
    The family adds `layer_types` and its own fields.
    """
    act = text.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; the built families use 'silu' (SwiGLU).")
    if text.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported; Qwen3 releases disable it.")

    # transformers 5 writes one `rope_parameters` (theta included); older files a `rope_scaling`
    # beside a top-level rope_theta.
    rope = {**(text.get("rope_scaling") or {}), **(text.get("rope_parameters") or {})}
    theta = rope.get("rope_theta", text.get("rope_theta"))
    if theta is None:
        raise ValueError(
            f"HF config ({model_type}) has no rope_theta in rope_parameters or top level."
        )
    partial = rope.get(
        "partial_rotary_factor", text.get("partial_rotary_factor", partial_rotary_factor)
    )
    heads = hf_field(text, "num_attention_heads", model_type)
    hidden = hf_field(text, "hidden_size", model_type)
    # The wrapper's (chat) EOS first; a text-only config is its own wrapper, deduplicated below.
    eos = _as_list(top.get("eos_token_id")) + _as_list(text.get("eos_token_id"))
    return {
        "vocab_size": hf_field(text, "vocab_size", model_type),
        "hidden_size": hidden,
        "intermediate_size": hf_field(text, "intermediate_size", model_type),
        "num_hidden_layers": hf_field(text, "num_hidden_layers", model_type),
        "num_attention_heads": heads,
        "num_key_value_heads": text.get("num_key_value_heads") or heads,
        "head_dim": text.get("head_dim") or hidden // heads,
        "rms_norm_eps": float(text.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta),
        "rope_scaling": _rope_scaling(rope, model_type),
        "partial_rotary_factor": float(partial),
        "max_position_embeddings": text.get("max_position_embeddings", 32768),
        # The VLM wrapper owns the lm_head, so its top-level flag wins over text_config's.
        "tie_word_embeddings": bool(
            top.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
        ),
        "attention_bias": bool(text.get("attention_bias", False)),
        "initializer_range": float(text.get("initializer_range", 0.02)),
        "pad_token_id": text.get("pad_token_id", top.get("pad_token_id")),
        "eos_token_ids": tuple(dict.fromkeys(eos)),
    }


def _rope_scaling(rope: Mapping[str, Any], model_type: str) -> RopeScaling | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type not in ROPE_TYPES:
        raise ValueError(f"HF config ({model_type}): rope_type {rope_type!r} is not supported; built: "
                         f"'default', {', '.join(map(repr, ROPE_TYPES))}.")
    if "factor" not in rope:
        raise ValueError(f"HF config ({model_type}): rope_type {rope_type!r} needs a 'factor'.")
    fields = {f.name for f in dataclasses.fields(RopeScaling)} - {"rope_type"}
    return RopeScaling(rope_type=rope_type, **{k: rope[k] for k in fields if k in rope})


def hf_text_dict(config: ModelConfig) -> dict[str, Any]:
    """The config.json fields every family writes alike (`hf_text_fields` reads them back)."""
    eos = config.eos_token_ids
    return {
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": config.rms_norm_eps,
        "max_position_embeddings": config.max_position_embeddings,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.attention_bias,
        "initializer_range": config.initializer_range,
        "layer_types": list(config.layer_types),
        "pad_token_id": config.pad_token_id,
        "eos_token_id": list(eos) if len(eos) > 1 else (eos[0] if eos else None),
        "rope_parameters": {
            **(config.rope_scaling.to_hf() if config.rope_scaling else {"rope_type": "default"}),
            "rope_theta": config.rope_theta,
        },
    }


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]


def read_hf_config(path: str | os.PathLike) -> dict[str, Any]:
    """The HF `config.json` at `path` (a checkpoint directory or the file), local or gs://: the one
    reader of a checkpoint's architecture."""
    from etils import epath

    from intraskill_jax.errors import CheckpointError

    file = epath.Path(path)
    if file.is_dir():
        file = file / "config.json"
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"No HF config at {file}; point to a checkpoint directory with config.json.") from e
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: not valid JSON ({e}); re-export the checkpoint.") from e
