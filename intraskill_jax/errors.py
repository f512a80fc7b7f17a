"""The project's error types: one class per kind of bad input, whichever module detects it.

`ConfigError`: a config value or combination that cannot run; raised when the config is loaded,
before any work. `sim/` is usable without the trainer, so the class is defined there and the
trainer's configs raise the same one.

`CheckpointError`: a checkpoint that is missing, unreadable or does not fit what asks for it:
the run state under `checkpoints/` (orbax) and HF directories (config.json, safetensors) alike.
"""

from __future__ import annotations

from sim.config import ConfigError

__all__ = ["CheckpointError", "ConfigError"]


class CheckpointError(ValueError):
    """A checkpoint that cannot be read as asked; the message names the path and the fix."""
