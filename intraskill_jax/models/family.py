"""What a model family provides: one `Family` record per folder under `models/`, registered in
`models/families.py`.

A family is its model class (the shared decoder stack configured by an `Architecture`), its
config.json conversion, its checkpoint key map and the tool-call format of its chat template.
Everything else (the loader and saver in `models/params.py`, `causal_lm_class`, the agent's
tool-call parsing) asks the registry for these and never names a family.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from typing import Any

from intraskill_jax.models.config import ModelConfig
from intraskill_jax.models.decoder import Architecture, CausalLM
from intraskill_jax.tokenization import TOOL_FORMATS, ToolFormat

# Buffers older exports save although the model recomputes them; every family skips them.
RECOMPUTED_BUFFERS = (re.compile(r"(^|\.)rotary_emb\.inv_freq$"),)


@dataclasses.dataclass(frozen=True, kw_only=True)
class KeyMap:
    """A family's checkpoint keys onto NNX parameter paths (dot-joined) and back.

    NNX attribute names and parameter layouts equal HF's, so the map is a prefix rule: a
    multimodal wrapper stores the text model under `wrapped_prefix`, a text-only checkpoint under
    `text_prefix` (the NNX path itself). Every checkpoint key is either a parameter or matched by
    `skip`.

    Attributes:
      skip: keys with no counterpart in the text policy (vision tower, MTP head, buffers).
      text_prefix: where the text model's parameters sit in the NNX state.
      wrapped_prefix: where the family's multimodal wrapper keeps them; None: it has none.
    """

    skip: tuple[re.Pattern[str], ...] = RECOMPUTED_BUFFERS
    text_prefix: str = "model."
    wrapped_prefix: str | None = None

    def to_model_key(self, hf_key: str) -> str | None:
        """The NNX path for a checkpoint key, or None when a skip pattern matches."""
        if any(p.search(hf_key) for p in self.skip):
            return None
        if self.wrapped_prefix and hf_key.startswith(self.wrapped_prefix):
            return self.text_prefix + hf_key[len(self.wrapped_prefix) :]
        return hf_key

    def to_hf_key(self, model_key: str, wrapped: bool) -> str:
        """The checkpoint key for an NNX path, in the wrapper's layout when `wrapped`."""
        if wrapped and self.wrapped_prefix and model_key.startswith(self.text_prefix):
            return self.wrapped_prefix + model_key[len(self.text_prefix) :]
        return model_key


@dataclasses.dataclass(frozen=True, kw_only=True)
class Family:
    """One model family.

    Attributes:
      name: its `ModelConfig.family`.
      model_types: the config.json `model_type`s read as this family; saves write the first.
      architectures: the HF class names of those layouts; saves write the first.
      model_class: the NNX model; its `architecture` configures the shared decoder stack.
      fields_from_hf: a parsed config.json -> `ModelConfig` fields (all but `family`).
      to_hf: a `ModelConfig` -> its text-only config.json (all but model_type and architectures).
      keys: checkpoint keys <-> parameter paths.
      tool_format: how the family's chat template writes tool calls (`tokenization.ToolFormat`),
        and so how the agent parses the policy's replies.
    """

    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    model_class: type[CausalLM]
    fields_from_hf: Callable[[Mapping[str, Any]], dict[str, Any]]
    to_hf: Callable[[ModelConfig], dict[str, Any]]
    keys: KeyMap
    tool_format: ToolFormat

    def __post_init__(self) -> None:
        if self.model_class.family != self.name:
            raise ValueError(
                f"Family {self.name!r}: model_class {self.model_class.__name__} is for family "
                f"{self.model_class.family!r}; set its `family` to {self.name!r}."
            )
        if not self.model_types or not self.architectures:
            raise ValueError(f"Family {self.name!r}: name at least one model_type and architecture.")
        if self.tool_format not in TOOL_FORMATS:
            raise ValueError(
                f"Family {self.name!r}: tool_format {self.tool_format!r} is none of {TOOL_FORMATS}."
            )

    @property
    def architecture(self) -> Architecture:
        return self.model_class.architecture
