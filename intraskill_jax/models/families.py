"""The registry of model families: the one place that lists them.

A new family is a folder under `models/` whose `__init__.py` defines `FAMILY` (a
`models.family.Family`), plus its line in `_REGISTERED`. The config.json conversion
(`config_from_hf`, `hf_config`), the loader and saver in `models/params.py`, `causal_lm_class` and
the run config (the agent's tool-call format) find it here, by `ModelConfig.family` or by a
config.json's `model_type`. Nothing a family imports imports this module, so the registry sits
above the families and `models/config.py` below them, with no import circle.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import os

from intraskill_jax.models import llama, qwen3, qwen3_5
from intraskill_jax.models.config import ModelConfig, read_hf_config
from intraskill_jax.models.family import Family

_REGISTERED: tuple[Family, ...] = (
    qwen3_5.FAMILY,
    qwen3.FAMILY,
    llama.FAMILY,
)


def _index(families: tuple[Family, ...]) -> tuple[dict[str, Family], dict[str, Family]]:
    by_name: dict[str, Family] = {}
    by_model_type: dict[str, Family] = {}
    for family in families:
        if family.name in by_name:
            raise ValueError(f"Two model families are named {family.name!r}.")
        by_name[family.name] = family
        for model_type in family.model_types:
            if model_type in by_model_type:
                raise ValueError(
                    f"model_type {model_type!r} is claimed by families "
                    f"{by_model_type[model_type].name!r} and {family.name!r}."
                )
            by_model_type[model_type] = family
    return by_name, by_model_type


FAMILIES, _BY_MODEL_TYPE = _index(_REGISTERED)


def get_family(name: str) -> Family:
    """The family named `name` (a `ModelConfig.family`)."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(
            f"Unknown model family {name!r}; registered: {sorted(FAMILIES)}. A family is a folder "
            "under intraskill_jax/models/ registered in models/families.py."
        ) from None


def family_for_hf(hf_config: Mapping[str, Any]) -> Family:
    """The family of a parsed HF config.json, by its `model_type`."""
    model_type = hf_config.get("model_type")
    family = _BY_MODEL_TYPE.get(model_type)
    if family is None:
        supported = ", ".join(
            f"{mt!r} ({f.name})" for mt, f in _BY_MODEL_TYPE.items()
        )
        raise ValueError(
            f"Unsupported model_type {model_type!r}; supported: {supported}. MoE variants "
            "(qwen3_5_moe, qwen3_next) are not built."
        )
    return family


def config_from_hf(hf: Mapping[str, Any], **overrides: Any) -> ModelConfig:
    """The `ModelConfig` of a parsed HF config.json (the family its `model_type` names);
    `overrides` set our own fields (numerics, kernel shapes)."""
    family = family_for_hf(hf)
    return ModelConfig(**{"family": family.name, **family.fields_from_hf(hf), **overrides})


def config_from_file(path: str | os.PathLike, **overrides: Any) -> ModelConfig:
    """`config_from_hf` of the config.json at `path` (a checkpoint directory or the file)."""
    return config_from_hf(read_hf_config(path), **overrides)


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """The text-only HF config.json of `config` (its family's first `model_type`)."""
    family = get_family(config.family)
    return {"model_type": family.model_types[0], "architectures": [family.architectures[0]], **family.to_hf(config)}
