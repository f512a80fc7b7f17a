"""Orbax checkpoints of a training run: params, optimizer state, step, RNG key, loop cursor.

Each step directory `<dir>/<step>/` holds two items:

* `state`: the arrays, as a nested dict whose keys are the pytree path (`train/params/model/
  layers/0/mlp/up_proj/weight`, `train/opt_state/1/0/mu/...`, `rng`). Writing plain nested
  dicts rather than the pytree itself keeps the files readable by a different flax/optax
  version, whose State or optimizer node classes may flatten differently;
* `meta`: JSON with the format version, the RNG implementation, each array's path, shape and
  dtype (for a clear mismatch message before any read), and the loop's `extra` dict (data cursor,
  skill-bank version, ...).

The directory may be local or gs:// (a `rundir` path); orbax commits a step in the way each store
allows. Locally it writes `<step>.orbax-checkpoint-tmp` and renames it into place once every item
is complete; on gs://, where a rename is not atomic, it writes `<step>/` directly and
`<step>/commit_success.txt` last. Either way a kill at any moment leaves the finished step or an
unfinished one that is never listed or restored (and is removed when the next Checkpointer opens
the directory).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, Self

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from intraskill_jax import rundir
from intraskill_jax.errors import CheckpointError

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


@dataclasses.dataclass
class Restored:
    """What `Checkpointer.restore` returns."""

    step: int
    state: Any
    rng: jax.Array | None
    extra: dict[str, Any]


# -- pytree <-> nested dict of path keys -----------------------------------------------------


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _key_name(entry: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(entry, attr):
            return str(getattr(entry, attr))
    return str(entry)


def _leaves_with_paths(tree: Any) -> tuple[list[tuple[tuple[str, ...], Any]], Any]:
    """[(path, leaf)] with nnx Variables as leaves (their path is where they sit, not their
    internals), and the treedef to rebuild the tree."""
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_is_variable)
    return [(tuple(_key_name(e) for e in path), leaf) for path, leaf in flat], treedef


def _value(leaf: Any) -> Any:
    return leaf.get_value() if _is_variable(leaf) else leaf


def _nest(items: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for path, value in items:
        node = root
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return root


def _lookup(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for key in path:
        node = node[key]
    return node


def _abstract(x: Any) -> jax.ShapeDtypeStruct:
    sharding = getattr(x, "sharding", None)
    if sharding is None:
        sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=sharding)


# -- the checkpointer --------------------------------------------------------------------------


class Checkpointer:
    """Saves and restores training state under one directory, keeping the newest `max_to_keep`.

    Args:
      directory: where step directories live (created if needed).
      max_to_keep: finished checkpoints to keep (older ones are deleted); None keeps all.
      async_save: return from `save` once arrays are copied to host, writing in the background
        (the next save, `wait_until_finished` or `close` waits for it).
    """

    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True):
        if max_to_keep is not None and max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1 (or None to keep all), got {max_to_keep}")
        directory = rundir.run_path(directory)
        self.directory = directory if rundir.is_remote(directory) else directory.absolute()
        options = ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True, cleanup_tmp_directories=True,
            enable_async_checkpointing=async_save)
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"))

    # -- queries
    def all_steps(self) -> list[int]:
        """Finished checkpoints, oldest first (unfinished writes are not listed)."""
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def step_path(self, step: int) -> epath.Path:
        return self.directory / str(step)

    # -- save
    def save(self, step: int, state: Any, *, rng: jax.Array | None = None,
             extra: Mapping[str, Any] | None = None) -> None:
        """Checkpoint `state` (any pytree of arrays, e.g. a TrainState) as step `step`.

        `rng` may be a typed key (`jax.random.key`) or raw uint32 key data; `extra` must be
        JSON-serialisable.
        """
        extra = dict(extra or {})
        try:
            json.dumps(extra)
        except TypeError as e:
            raise TypeError(f"Checkpoint extra must be JSON-serialisable: {e}") from e
        if step in self._manager.all_steps():
            raise CheckpointError(f"A checkpoint for step {step} already exists at {self.step_path(step)}.")
        leaves, _ = _leaves_with_paths(state)
        items = [(("train",) + path, _value(leaf)) for path, leaf in leaves]
        rng_impl = None
        if rng is not None:
            if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
                rng_impl = str(jax.random.key_impl(rng))
                items.append((("rng",), jax.random.key_data(rng)))
            else:
                rng_impl = "raw"
                items.append((("rng",), rng))
        meta = {
            "format": FORMAT_VERSION,
            "step": int(step),
            "rng_impl": rng_impl,
            "arrays": {"/".join(path): [list(np.shape(v)), str(np.dtype(v.dtype))] for path, v in items},
            "extra": extra,
        }
        self._manager.save(int(step), args=ocp.args.Composite(
            state=ocp.args.StandardSave(_nest(items)), meta=ocp.args.JsonSave(meta)), force=True)
        rundir.reached("checkpoint_commit")  # an async save is still writing: the step is not committed

    def wait_until_finished(self) -> None:
        self._manager.wait_until_finished()

    # -- restore
    def restore(self, target: Any, *, step: int | None = None) -> Restored:
        """Restore onto `target`: a pytree like the saved state, of arrays or ShapeDtypeStructs
        whose shardings say where each restored array goes (a mesh layout, one device, ...).

        Restores the latest finished step unless `step` is given.
        """
        self.wait_until_finished()
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise CheckpointError(f"No finished checkpoint in {self.directory}; nothing to resume from.")
            step = steps[-1]
        elif step not in steps:
            raise CheckpointError(f"No finished checkpoint for step {step} in {self.directory}; available: {steps}.")
        path = self.step_path(step)
        meta = self._read_meta(step, path)

        leaves, treedef = _leaves_with_paths(target)
        wanted = [(("train",) + p, _abstract(_value(leaf))) for p, leaf in leaves]
        saved = meta["arrays"]
        problems = []
        for p, a in wanted:
            key = "/".join(p)
            if key not in saved:
                problems.append(f"{key} is not in the checkpoint")
            elif tuple(saved[key][0]) != tuple(a.shape) or saved[key][1] != str(np.dtype(a.dtype)):
                problems.append(f"{key}: checkpoint has {saved[key][1]}{tuple(saved[key][0])}, target {a.dtype}{a.shape}")
        if problems:
            raise CheckpointError(f"Checkpoint {path} does not fit the restore target: " + "; ".join(problems[:5])
                                  + (f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""))
        rng_impl = meta.get("rng_impl")
        if rng_impl is not None:
            shape, dtype = saved["rng"]
            device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
            wanted.append((("rng",), jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), sharding=device)))
        try:
            arrays = self._manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(_nest(wanted)))).state
        except Exception as e:  # orbax/tensorstore raise many types for missing or damaged files
            raise CheckpointError(f"Checkpoint {path} is unreadable ({type(e).__name__}: {e}). Delete that step "
                                  "directory to resume from the one before it.") from e

        values = [_lookup(arrays, p) for p, _ in wanted[: len(leaves)]]
        state = treedef.unflatten([leaf.replace(v) if _is_variable(leaf) else v
                                   for (_, leaf), v in zip(leaves, values)])
        rng = None
        if rng_impl is not None:
            data = arrays["rng"]
            rng = data if rng_impl == "raw" else jax.random.wrap_key_data(data, impl=rng_impl)
        return Restored(step=step, state=state, rng=rng, extra=meta.get("extra", {}))

    def _read_meta(self, step: int, path: epath.Path) -> dict[str, Any]:
        try:
            meta = self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta
        except Exception as e:
            raise CheckpointError(f"Checkpoint {path} has no readable metadata ({type(e).__name__}: {e}). "
                                  "Delete that step directory to resume from the one before it.") from e
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or "arrays" not in meta:
            raise CheckpointError(f"Checkpoint {path} has metadata of an unknown format (expected format "
                                  f"{FORMAT_VERSION}); it was not written by this Checkpointer.")
        return meta

    # -- lifetime
    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
