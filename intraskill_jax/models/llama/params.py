"""Llama checkpoint keys: the NNX paths themselves (`model.`, `lm_head.`), no multimodal wrapper."""

from intraskill_jax.models.family import KeyMap

KEYS = KeyMap()
