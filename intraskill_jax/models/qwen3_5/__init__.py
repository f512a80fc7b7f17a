"""The Qwen3.5 family: `model.py` (the Gated DeltaNet hybrid, config.json conversion) and
`params.py` (checkpoint keys); its chat template writes XML tool calls."""

from intraskill_jax.models.family import Family
from intraskill_jax.models.qwen3_5 import model, params
from intraskill_jax.models.qwen3_5.model import GatedDeltaNet, Qwen3_5ForCausalLM

FAMILY = Family(
    name=model.NAME,
    model_types=(model.TEXT_MODEL_TYPE, model.WRAPPER_MODEL_TYPE),
    architectures=("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"),
    model_class=Qwen3_5ForCausalLM,
    fields_from_hf=model.fields_from_hf,
    to_hf=model.to_hf,
    keys=params.KEYS,
    tool_format="xml",
)

__all__ = ["FAMILY", "GatedDeltaNet", "Qwen3_5ForCausalLM"]
