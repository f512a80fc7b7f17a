"""Qwen3 dense in Flax NNX (HF `Qwen3ForCausalLM`).

Qwen3 is the Qwen3.5 decoder stack with only full-attention layers, plain `w · x̂` RMSNorms
(q/k norms included), no attention output gate and RoPE over the whole head_dim; the config's
family ('qwen3') selects all of that, so the modules are shared with `qwen3_5.py`.
"""

from __future__ import annotations

from flax import nnx

from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.qwen3_5 import CausalLM


class Qwen3ForCausalLM(CausalLM):
    """Qwen3 dense text model with LM head; parameter paths equal HF keys."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
        if config.family != "qwen3":
            raise ValueError(f"Qwen3ForCausalLM needs family='qwen3'; got {config.family!r}.")
        super().__init__(config, rngs=rngs)
