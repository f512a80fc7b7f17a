"""The study's protocol on a dense Qwen3-4B (JSON tool calls, no DeltaNet layers: both follow
from the checkpoint's config.json, so only the path changes).

    intraskill train --config=configs/qwen3_4b.py --workdir=... --config.policy.path=/ckpt/Qwen3-4B

Qwen3's own chat template drops the empty think block of earlier assistant turns when thinking is
off, so the trajectories could not equal a re-render of their conversations: loading its tokenizer
with agent.enable_thinking=False (the default) stops with that message. Add
--config.agent.enable_thinking=True, or save a template that keeps history as sampled as the
checkpoint's chat_template.jinja.
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
