"""Policy models in Flax NNX: one folder per family (`qwen3_5/`, `qwen3/`, `llama/`) over a shared
decoder stack (`decoder.py`, `layers.py`, `gated_delta.py`), listed in `families.py`."""

from intraskill_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache, init_cache
from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.decoder import Architecture, CausalLM
from intraskill_jax.models.families import (
    FAMILIES,
    config_from_file,
    config_from_hf,
    family_for_hf,
    get_family,
    hf_config,
)
from intraskill_jax.models.family import Family
from intraskill_jax.models.logprobs import logprobs_from_hidden, token_logprobs
from intraskill_jax.models.params import load_pretrained, save_pretrained
from intraskill_jax.models.llama import LlamaForCausalLM
from intraskill_jax.models.qwen3 import Qwen3ForCausalLM
from intraskill_jax.models.qwen3_5 import Qwen3_5ForCausalLM


def causal_lm_class(config: ModelConfig) -> type[CausalLM]:
    """The model class for a config's family."""
    return get_family(config.family).model_class


__all__ = [
    "FAMILIES",
    "Architecture",
    "AttentionCache",
    "CausalLM",
    "DecodeCache",
    "DeltaNetCache",
    "Family",
    "LlamaForCausalLM",
    "ModelConfig",
    "Qwen3ForCausalLM",
    "Qwen3_5ForCausalLM",
    "causal_lm_class",
    "config_from_file",
    "config_from_hf",
    "family_for_hf",
    "get_family",
    "hf_config",
    "init_cache",
    "load_pretrained",
    "logprobs_from_hidden",
    "save_pretrained",
    "token_logprobs",
]
