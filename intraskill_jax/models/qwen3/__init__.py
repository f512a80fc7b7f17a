"""The Qwen3 dense family: `model.py` (full-attention stack, config.json conversion) and
`params.py` (checkpoint keys); its chat template writes JSON tool calls."""

from intraskill_jax.models.family import Family
from intraskill_jax.models.qwen3 import model, params
from intraskill_jax.models.qwen3.model import Qwen3ForCausalLM

FAMILY = Family(
    name=model.NAME,
    model_types=(model.MODEL_TYPE,),
    architectures=("Qwen3ForCausalLM",),
    model_class=Qwen3ForCausalLM,
    fields_from_hf=model.fields_from_hf,
    to_hf=model.to_hf,
    keys=params.KEYS,
    tool_format="json",
)

__all__ = ["FAMILY", "Qwen3ForCausalLM"]
