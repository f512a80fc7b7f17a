"""Qwen3.5 checkpoint keys: the text model at `model.`, or at `model.language_model.` inside the
multimodal `Qwen3_5ForConditionalGeneration`, whose vision tower and multi-token-prediction head
the text policy skips (and a save copies back from the source checkpoint)."""

import re

from intraskill_jax.models.family import RECOMPUTED_BUFFERS, KeyMap

KEYS = KeyMap(
    skip=(
        re.compile(r"^model\.visual\."),  # vision tower of Qwen3_5ForConditionalGeneration
        re.compile(r"^mtp\."),  # multi-token-prediction head
        *RECOMPUTED_BUFFERS,
    ),
    wrapped_prefix="model.language_model.",
)
