"""The controls the original study lacked, as presets that change only what they name.

    --config=configs/qwen3_5_4b.py:plain_grpo     no skill text ever (masks, retry, gate off)
    --config=configs/qwen3_5_4b.py:fixed_skill    S0 in every prompt, never evolved
    --config=configs/qwen3_5_4b.py:no_mask        the full current bank in every prompt, evolution on
    --config=configs/qwen3_5_4b.py                co-evolution as in the study (the default)

`intraskill multiseed` runs any of them over several seeds.
"""

from __future__ import annotations

from typing import Any

PRESETS = ("coevolve", "plain_grpo", "fixed_skill", "no_mask")


def apply(config: Any, preset: str | None) -> Any:
    """Edits a run ConfigDict in place for `preset` (None or 'coevolve' leaves it as is)."""
    preset = preset or "coevolve"
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    if preset == "plain_grpo":
        config.skills.mode = "none"
    elif preset in ("fixed_skill", "no_mask"):
        config.skills.mode = "fixed" if preset == "fixed_skill" else "coevolve"
        # Every group sees every active chunk: no skill-free groups, inclusion pinned at 1.
        config.skills.masks.skill_free = 0.0
        config.skills.masks.prior = config.skills.masks.floor = config.skills.masks.ceiling = 1.0
    if preset != "coevolve":
        config.name = f"{config.name}-{preset}"
    return config
