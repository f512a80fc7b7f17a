"""`intraskill serve`: the SGLang-compatible server over the embedded JAX sampler.

    intraskill serve --model-path /ckpt/hf/weight_v000000 --port 30000

The model and tokenizer load from an HF directory (the same files SGLang would load), and
`/update_weights_from_disk` reloads weights in place from another such directory (what the
trainer's weight sync writes), so TPU users get hot reload that sglang-jax lacks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from absl import flags
from fastapi import FastAPI

from sim import flagparse

from intraskill_jax import rundir
from intraskill_jax.rollout.base import WeightUpdate
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from intraskill_jax.rollout.server import create_app

log = logging.getLogger(__name__)


def build_app(model_path: str, sampler: SamplerConfig | None = None, *, dtype: str | None = None) -> FastAPI:
    """Loads model + tokenizer from `model_path` and returns the app (weight reload wired in).
    Both paths, `model_path` and those of later reloads, may be local or gs:// (a run directory)."""
    from transformers import AutoTokenizer

    from intraskill_jax.models.params import load_pretrained

    with rundir.local_dir(model_path) as local:
        tokenizer = AutoTokenizer.from_pretrained(str(local))
        engine = JaxSampler(load_pretrained(local, dtype=dtype), sampler)

    def reload(path: str) -> None:
        with rundir.local_dir(path) as local:
            model = load_pretrained(local, dtype=dtype)
        if model.config != engine.model_config:
            raise ValueError(f"{path} holds a different architecture than the served model")
        # The server sets the version the client sent once the load has succeeded.
        engine.update_weights(WeightUpdate.published(engine.weight_version, path, lambda: model))
        log.info("reloaded weights from %s", path)

    return create_app(engine, tokenizer=tokenizer, reload=reload, model_name=model_path)


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_string("model-path", None, "HF checkpoint directory (config.json, safetensors, tokenizer)",
                        required=True, flag_values=values)
    flags.DEFINE_string("host", "127.0.0.1", "address to listen on", flag_values=values)
    flags.DEFINE_integer("port", 30000, "port to listen on", flag_values=values)
    flags.DEFINE_integer("max-batch", SamplerConfig.max_batch, "concurrent sessions", flag_values=values)
    flags.DEFINE_integer("max-length", SamplerConfig.max_length, "cache slots", flag_values=values)
    flags.DEFINE_string("dtype", None, "float32 | bfloat16 (default: by backend)", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    args = flagparse.parse("intraskill serve", __doc__, _define_flags, argv)
    import uvicorn

    logging.basicConfig(level=logging.INFO)
    app = build_app(args.model_path, SamplerConfig(max_batch=args.max_batch, max_length=args.max_length), dtype=args.dtype)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
