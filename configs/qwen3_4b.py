"""The study's protocol on a dense Qwen3-4B (JSON tool calls, no DeltaNet layers: both follow
from the checkpoint's config.json, so only the path changes).

    intraskill train --config=configs/qwen3_4b.py --workdir=... --config.policy.path=/ckpt/Qwen3-4B
"""

import importlib.util
from pathlib import Path

import ml_collections

from intraskill_jax import presets

PRESETS = presets.PRESETS  # configs/qwen3_4b.py:<preset>, as configs/qwen3_5_4b.py


def get_config(preset: str | None = None) -> ml_collections.ConfigDict:
    spec = importlib.util.spec_from_file_location("_qwen3_5_4b", Path(__file__).with_name("qwen3_5_4b.py"))
    base = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(base)
    c = base.get_config(preset)
    c.name = c.name.replace("qwen3_5_4b", "qwen3_4b")
    c.policy.path = "/path/to/Qwen3-4B"
    return c
