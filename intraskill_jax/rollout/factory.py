"""The rollout engine named by `rollout.engine`, built in this one place.

A new engine is one file beside this one plus one entry in `ENGINES` (and its name among
`RolloutConfig.engine`'s values). Builders import their engine's module only when called, so a run
pays only for the engine it uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from intraskill_jax.rollout.base import RolloutEngine, WeightUpdate

if TYPE_CHECKING:  # runconfig imports the rollout records; this module is imported after it
    from intraskill_jax.runconfig import RolloutConfig

EngineBuilder = Callable[["RolloutConfig", WeightUpdate], RolloutEngine]


def _jax(config: RolloutConfig, initial: WeightUpdate) -> RolloutEngine:
    from intraskill_jax.rollout.jax_sampler import JaxSampler

    return JaxSampler(initial.model(), config.sampler, weight_version=initial.version)


def _sglang(config: RolloutConfig, initial: WeightUpdate) -> RolloutEngine:
    from intraskill_jax.rollout.sglang import SGLangEngine

    engine = SGLangEngine(config.url)
    # The server holds what it was launched on (`policy.path`); the run may start elsewhere (the
    # warm start's `sft/hf`, a resumed step), so it loads the starting weights before any rollout.
    engine.update_weights(initial)
    return engine


ENGINES: dict[str, EngineBuilder] = {"jax": _jax, "sglang": _sglang}


def make_engine(config: RolloutConfig, initial: WeightUpdate) -> RolloutEngine:
    """The engine `config.engine` names, starting from `initial`.

    In-process engines are built on `initial.model()`; a server client has its server load
    `initial.hf_dir()`, so every engine starts from `initial`'s weights at `initial.version`.
    """
    if config.engine not in ENGINES:
        raise ValueError(f"rollout.engine={config.engine!r} names no engine; known: {sorted(ENGINES)}")
    return ENGINES[config.engine](config, initial)
