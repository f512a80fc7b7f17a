"""Text-model configuration for Qwen3.5 (Gated DeltaNet hybrid) and Qwen3 dense.

One frozen dataclass, `ModelConfig`, whose architecture fields carry the HuggingFace names
(`hidden_size`, `linear_num_value_heads`, ...) so a reader can match each one to `config.json`.
`ModelConfig.from_hf_dict` accepts the three layouts we meet in the wild:

* `qwen3_5` (`Qwen3_5ForConditionalGeneration`): architecture under `text_config`; the vision
  tower is ignored (logged);
* `qwen3_5_text` (`Qwen3_5ForCausalLM` saves);
* `qwen3` (dense Qwen3).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Literal

import jax
import jax.numpy as jnp

logger = logging.getLogger(__name__)

Family = Literal["qwen3_5", "qwen3"]
LayerType = Literal["linear_attention", "full_attention"]
DType = Literal["float32", "bfloat16"]
RematPolicy = Literal["none", "full", "dots_saveable"]

_LAYER_TYPES = ("linear_attention", "full_attention")
_DTYPES = ("float32", "bfloat16")
_REMAT = ("none", "full", "dots_saveable")


def default_dtype() -> DType:
    """float32 on CPU (tests, parity), bfloat16 on accelerators."""
    return "float32" if jax.default_backend() == "cpu" else "bfloat16"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """Architecture and numerics of a Qwen3.5 / Qwen3 text model.

    Attributes:
      family: 'qwen3_5' (zero-centred (1+w) norms, gated attention, partial RoPE, Gated DeltaNet
        layers) or 'qwen3' (plain w norms, no output gate, full RoPE, attention only).
      vocab_size .. rms_norm_eps: as in HF `config.json`.
      rope_theta: `rope_parameters.rope_theta` (or legacy top-level `rope_theta`).
      partial_rotary_factor: fraction of head_dim that is rotated (Qwen3.5: 0.25).
      layer_types: one of 'linear_attention' / 'full_attention' per layer.
      linear_*: Gated DeltaNet sizes (ignored when no layer is 'linear_attention').
      tie_word_embeddings: when true there is no `lm_head.weight`; logits use the embedding.
      attention_bias: biases on q/k/v/o projections (HF field; false for released models).
      pad_token_id, eos_token_ids: token ids the sampler needs (all EOS ids seen in the config).
      dtype: compute dtype (activations and matmul inputs).
      param_dtype: storage dtype of parameters.
      remat: per-decoder-layer rematerialization: 'none', 'full' (save only layer inputs) or
        'dots_saveable' (keep matmul outputs, recompute elementwise work).
      gdn_chunk_size: chunk length of the chunked Gated DeltaNet kernel (prefill / training).
      logits_chunk_size: sequence chunk used by `token_logprobs` to avoid full-vocab logits.
      attention_block_size: 0 (default) computes whole-sequence attention with
        `jax.nn.dot_product_attention` (fused kernels on GPU/TPU); N > 0 computes it N queries at
        a time, skipping the masked upper triangle (faster on CPU, which has no fused kernel).
    """

    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000.0
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
    initializer_range: float = 0.02
    pad_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: DType = dataclasses.field(default_factory=default_dtype)
    param_dtype: DType = dataclasses.field(default_factory=default_dtype)
    remat: RematPolicy = "none"
    gdn_chunk_size: int = 64
    logits_chunk_size: int = 512
    attention_block_size: int = 0

    def __post_init__(self) -> None:
        if self.family not in ("qwen3_5", "qwen3"):
            raise ValueError(f"family must be 'qwen3_5' or 'qwen3'; got {self.family!r}.")
        if not self.layer_types:
            object.__setattr__(
                self, "layer_types", default_layer_types(self.family, self.num_hidden_layers)
            )
        else:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
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
        if self.family == "qwen3" and "linear_attention" in self.layer_types:
            raise ValueError("Qwen3 dense has only 'full_attention' layers; set family='qwen3_5'.")
        if not 0.0 < self.partial_rotary_factor <= 1.0:
            raise ValueError(
                f"partial_rotary_factor must be in (0, 1]; got {self.partial_rotary_factor}."
            )
        if self.rotary_dim % 2:
            raise ValueError(
                f"rotary dim int(head_dim * partial_rotary_factor) = {self.rotary_dim} must be even."
            )
        if self.has_linear_attention:
            for name in (
                "linear_num_key_heads",
                "linear_num_value_heads",
                "linear_key_head_dim",
                "linear_value_head_dim",
                "linear_conv_kernel_dim",
            ):
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
        if not isinstance(self.attention_block_size, int) or self.attention_block_size < 0:
            raise ValueError(f"ModelConfig.attention_block_size must be an int >= 0; got {self.attention_block_size!r}.")
        if self.remat not in _REMAT:
            raise ValueError(f"remat must be one of {_REMAT}; got {self.remat!r}.")

    # ----------------------------------------------------------------- derived values
    @property
    def has_linear_attention(self) -> bool:
        return "linear_attention" in self.layer_types

    @property
    def zero_centered_norm(self) -> bool:
        """Qwen3.5 norms compute x̂·(1+w); Qwen3 norms compute x̂·w."""
        return self.family == "qwen3_5"

    @property
    def attn_output_gate(self) -> bool:
        """Qwen3.5 attention multiplies its output by sigmoid(gate) (HF always builds it)."""
        return self.family == "qwen3_5"

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

    # ----------------------------------------------------------------- HF interop
    @classmethod
    def from_hf_dict(cls, hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
        """Builds the config from a parsed HF `config.json`; `overrides` set our own fields."""
        return cls(**{**_fields_from_hf(hf), **overrides})

    @classmethod
    def from_json_file(cls, path: str | os.PathLike, **overrides: Any) -> ModelConfig:
        """Reads `config.json` (or a checkpoint directory holding one)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, "config.json")
        try:
            with open(path, encoding="utf-8") as f:
                hf = json.load(f)
        except FileNotFoundError as e:
            raise FileNotFoundError(
                f"No HF config at {path}; point to a checkpoint directory with config.json."
            ) from e
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} is not valid JSON ({e}); re-export the checkpoint.") from e
        return cls.from_hf_dict(hf, **overrides)

    def to_hf_dict(self) -> dict[str, Any]:
        """A text-only HF config dict (`qwen3_5_text` or `qwen3`) describing this architecture."""
        rope: dict[str, Any] = {"rope_type": "default", "rope_theta": self.rope_theta}
        out: dict[str, Any] = {
            "model_type": "qwen3_5_text" if self.family == "qwen3_5" else "qwen3",
            "architectures": [
                "Qwen3_5ForCausalLM" if self.family == "qwen3_5" else "Qwen3ForCausalLM"
            ],
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "initializer_range": self.initializer_range,
            "layer_types": list(self.layer_types),
            "pad_token_id": self.pad_token_id,
            "eos_token_id": (
                list(self.eos_token_ids)
                if len(self.eos_token_ids) > 1
                else (self.eos_token_ids[0] if self.eos_token_ids else None)
            ),
            "rope_parameters": rope,
        }
        if self.family == "qwen3_5":
            rope["partial_rotary_factor"] = self.partial_rotary_factor
            # Text-only positions make the three M-RoPE rows equal; the section only has to sum to
            # rotary_dim / 2 for HF to accept it.
            half = self.rotary_dim // 2
            rope["mrope_section"] = [half - 2 * (half // 3), half // 3, half // 3]
            rope["mrope_interleaved"] = True
            out.update(
                linear_num_key_heads=self.linear_num_key_heads,
                linear_num_value_heads=self.linear_num_value_heads,
                linear_key_head_dim=self.linear_key_head_dim,
                linear_value_head_dim=self.linear_value_head_dim,
                linear_conv_kernel_dim=self.linear_conv_kernel_dim,
            )
        return out

    # ----------------------------------------------------------------- presets
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
        return cls(**{**base, **overrides})

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
        return cls(**{**base, **overrides})

    @classmethod
    def qwen3_5_4b(cls, **overrides: Any) -> ModelConfig:
        """Qwen3.5-4B text model (reference §3.2); weights come from the checkpoint."""
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
        return cls(**{**base, **overrides})

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
        return cls(**{**base, **overrides})


def default_layer_types(
    family: Family, num_layers: int, full_attention_interval: int = 4
) -> tuple[LayerType, ...]:
    """Qwen3.5: every `full_attention_interval`-th layer (3, 7, ...) is full attention."""
    if family == "qwen3":
        return ("full_attention",) * num_layers
    return tuple(
        "full_attention" if (i + 1) % full_attention_interval == 0 else "linear_attention"
        for i in range(num_layers)
    )


def _fields_from_hf(hf: Mapping[str, Any]) -> dict[str, Any]:
    model_type = hf.get("model_type")
    eos: list[int] = []
    top = hf
    if model_type == "qwen3_5":
        if "text_config" not in hf:
            raise ValueError(
                "config.json has model_type 'qwen3_5' but no text_config; "
                "pass the Qwen3_5ForConditionalGeneration config unmodified."
            )
        if hf.get("vision_config"):
            logger.info("Ignoring vision_config: only the Qwen3.5 text model is built.")
        eos += _as_list(hf.get("eos_token_id"))
        hf = dict(hf["text_config"])
        model_type = hf.get("model_type", "qwen3_5_text")
    if model_type == "qwen3_5_text":
        family: Family = "qwen3_5"
    elif model_type == "qwen3":
        family = "qwen3"
    else:
        raise ValueError(
            f"Unsupported model_type {model_type!r}; supported: 'qwen3_5' (with text_config), "
            "'qwen3_5_text' and 'qwen3'. MoE variants (qwen3_5_moe, qwen3_next) are not built."
        )

    def need(key: str) -> Any:
        if key not in hf:
            raise ValueError(f"HF config ({model_type}) lacks required field {key!r}.")
        return hf[key]

    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; Qwen models use 'silu'.")
    if hf.get("use_sliding_window"):
        raise ValueError("use_sliding_window=true is not supported; Qwen3 releases disable it.")

    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"rope_type {rope_type!r} is not supported; only 'default' RoPE is built.")
    theta = rope.get("rope_theta", hf.get("rope_theta"))
    if theta is None:
        raise ValueError(
            f"HF config ({model_type}) has no rope_theta in rope_parameters or top level."
        )
    default_partial = 0.25 if family == "qwen3_5" else 1.0
    partial = rope.get("partial_rotary_factor", hf.get("partial_rotary_factor", default_partial))

    num_layers = need("num_hidden_layers")
    heads = need("num_attention_heads")
    layer_types = hf.get("layer_types")
    if family == "qwen3":
        if layer_types and any(t != "full_attention" for t in layer_types):
            raise ValueError(
                "Qwen3 layer_types other than 'full_attention' (sliding) are not supported."
            )
        layer_types = None
    elif not layer_types:
        layer_types = default_layer_types(family, num_layers, hf.get("full_attention_interval", 4))

    eos = eos + _as_list(hf.get("eos_token_id"))  # the wrapper's (chat) EOS first
    fields: dict[str, Any] = {
        "family": family,
        "vocab_size": need("vocab_size"),
        "hidden_size": need("hidden_size"),
        "intermediate_size": need("intermediate_size"),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": hf.get("num_key_value_heads") or heads,
        "head_dim": hf.get("head_dim") or need("hidden_size") // heads,
        "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
        "rope_theta": float(theta),
        "partial_rotary_factor": float(partial),
        "max_position_embeddings": hf.get("max_position_embeddings", 32768),
        "layer_types": tuple(layer_types) if layer_types else (),
        # The VLM wrapper owns the lm_head, so its top-level flag wins over text_config's.
        "tie_word_embeddings": bool(
            top.get("tie_word_embeddings", hf.get("tie_word_embeddings", False))
        ),
        "attention_bias": bool(hf.get("attention_bias", False)),
        "initializer_range": float(hf.get("initializer_range", 0.02)),
        "pad_token_id": hf.get("pad_token_id", top.get("pad_token_id")),
        "eos_token_ids": tuple(dict.fromkeys(eos)),
    }
    if family == "qwen3_5":
        fields.update(
            linear_num_key_heads=need("linear_num_key_heads"),
            linear_num_value_heads=need("linear_num_value_heads"),
            linear_key_head_dim=need("linear_key_head_dim"),
            linear_value_head_dim=need("linear_value_head_dim"),
            linear_conv_kernel_dim=need("linear_conv_kernel_dim"),
        )
    return fields


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [int(v) for v in value]
    return [int(value)]
