"""Policy models: Qwen3.5 (Gated DeltaNet hybrid) and Qwen3 dense in Flax NNX."""

from intraskill_jax.models.cache import AttentionCache, DecodeCache, DeltaNetCache, init_cache
from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.logprobs import logprobs_from_hidden, token_logprobs
from intraskill_jax.models.qwen3 import Qwen3ForCausalLM
from intraskill_jax.models.qwen3_5 import CausalLM, Qwen3_5ForCausalLM

# Checkpoint IO (`load_pretrained`, HF safetensors in/out) lives in models/params.py.


def causal_lm_class(config: ModelConfig) -> type[CausalLM]:
    """The model class for a config's family."""
    return Qwen3_5ForCausalLM if config.family == "qwen3_5" else Qwen3ForCausalLM


__all__ = [
    "AttentionCache",
    "CausalLM",
    "DecodeCache",
    "DeltaNetCache",
    "ModelConfig",
    "Qwen3ForCausalLM",
    "Qwen3_5ForCausalLM",
    "causal_lm_class",
    "init_cache",
    "logprobs_from_hidden",
    "token_logprobs",
]

# Checkpoint IO; imported last because params.py builds on the model modules above.
from intraskill_jax.models.params import load_pretrained, save_pretrained

__all__ += ["load_pretrained", "save_pretrained"]
