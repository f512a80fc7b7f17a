"""The Llama family (SmolLM2, Llama 3): `model.py` (the attention-only stack without q/k norms,
config.json conversion) and `params.py` (checkpoint keys). Its chat templates (ChatML for
SmolLM2) have no tool branch, so the agent writes the tools and calls as text in the JSON format
(`tokenization`)."""

from intraskill_jax.models.family import Family
from intraskill_jax.models.llama import model, params
from intraskill_jax.models.llama.model import LlamaForCausalLM

FAMILY = Family(
    name=model.NAME,
    model_types=(model.MODEL_TYPE,),
    architectures=("LlamaForCausalLM",),
    model_class=LlamaForCausalLM,
    fields_from_hf=model.fields_from_hf,
    to_hf=model.to_hf,
    keys=params.KEYS,
    tool_format="json",
)

__all__ = ["FAMILY", "LlamaForCausalLM"]
