"""A tiny GRPO training run that checkpoints every update and resumes from its directory.

Used by tests/test_checkpoint.py both in-process (the uninterrupted reference) and as a
subprocess that is SIGKILLed while a checkpoint is being committed:

    python -m tests.checkpoint_run WORKDIR STEPS [--kill-at-commit K] [--out FINAL.npz]

Each update draws its rows from the data cursor and its advantages from the run's RNG key, so a
resumed run only reproduces the uninterrupted one if step, params, optimizer state, RNG and
cursor all come back exactly.
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys

import jax
import numpy as np
from flax import nnx

from intraskill_jax import rundir
from intraskill_jax.checkpoint import Checkpointer
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.rl import train_step as ts
from intraskill_jax.rl.grpo import LossConfig

CONFIG = ModelConfig.tiny_qwen3(vocab_size=128, hidden_size=32, intermediate_size=64, num_attention_heads=2,
                                num_key_value_heads=1, num_hidden_layers=1)
OPTIM = ts.OptimConfig(learning_rate=1e-2, warmup_steps=2, weight_decay=0.01)
ROWS, LENGTH = 4, 16


def model_factory() -> nnx.Module:
    return causal_lm_class(CONFIG)(CONFIG, rngs=nnx.Rngs(0))


@functools.cache
def trainer() -> tuple[nnx.GraphDef, ts.UpdateStep]:
    """Built once per process, so in-process runs share one compiled step."""
    graphdef, _ = nnx.split(model_factory())
    return graphdef, ts.grpo_step(graphdef, ts.make_optimizer(OPTIM), OPTIM, LossConfig(), donate=True)


def fresh_state() -> ts.TrainState:
    return ts.init_train_state(model_factory(), ts.make_optimizer(OPTIM))[1]


def batch_for(cursor: int, key: jax.Array) -> ts.TrainBatch:
    rng = np.random.default_rng(cursor)
    tokens = rng.integers(1, CONFIG.vocab_size, (ROWS, LENGTH)).astype(np.int32)
    loss_mask = np.zeros((ROWS, LENGTH), np.float32)
    loss_mask[:, LENGTH // 2:] = 1
    collated = {"tokens": tokens, "attention_mask": np.ones_like(tokens), "loss_mask": loss_mask}
    return ts.train_batch(collated, advantages=np.asarray(jax.random.normal(key, (ROWS,))))


def train_one(state: ts.TrainState, rng: jax.Array, cursor: int) -> tuple[ts.TrainState, jax.Array, int]:
    """One update: (state, rng, cursor) -> the next (state, rng, cursor)."""
    rng, key = jax.random.split(rng)
    state, _ = trainer()[1](state, batch_for(cursor, key))
    return state, rng, cursor + 1


def run(workdir: str | os.PathLike, total_steps: int, *, max_to_keep: int = 3) -> ts.TrainState:
    """Train to `total_steps` updates, resuming from the newest checkpoint in `workdir`."""
    state, rng, cursor = fresh_state(), jax.random.key(0), 0
    with Checkpointer(rundir.checkpoints_dir(workdir), max_to_keep=max_to_keep) as ckpt:
        if ckpt.latest_step() is not None:
            restored = ckpt.restore(state)
            state, rng, cursor = restored.state, restored.rng, restored.extra["cursor"]
            print(f"resumed from step {restored.step}", flush=True)
        while int(state.step) < total_steps:
            state, rng, cursor = train_one(state, rng, cursor)
            ckpt.save(int(state.step), state, rng=rng, extra={"cursor": cursor})
            print(f"saving step {int(state.step)}", flush=True)
    return state


def flat_arrays(state: ts.TrainState) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in jax.tree_util.tree_flatten_with_path(state)[0]}


def _kill_when_committing(step: int) -> None:
    """SIGKILL this process at the moment orbax renames step `step` into place: every file of the
    step is written, only the commit is missing (the worst moment to die)."""
    rename = os.rename

    def hooked(src, dst, *args, **kwargs):
        if "orbax-checkpoint-tmp" in os.fspath(src) and os.path.basename(os.fspath(dst)) == str(step):
            os.kill(os.getpid(), signal.SIGKILL)
        return rename(src, dst, *args, **kwargs)

    os.rename = hooked


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workdir")
    parser.add_argument("steps", type=int)
    parser.add_argument("--kill-at-commit", type=int)
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    if args.kill_at_commit is not None:
        _kill_when_committing(args.kill_at_commit)
    state = run(args.workdir, args.steps)
    if args.out:
        np.savez(args.out, **flat_arrays(state))


if __name__ == "__main__":
    main(sys.argv[1:])
