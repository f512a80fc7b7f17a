"""One process of the multi-process training run in tests/test_distributed.py, or its single-process
reference: the smoke config's co-evolution loop (fresh policy, GRPO steps, a gate, the final HF
export) on a mesh over every device of every process.

    [INTRASKILL_NUM_PROCESSES=2 INTRASKILL_PROCESS_ID=i INTRASKILL_COORDINATOR=127.0.0.1:PORT] \
    JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=N \
        python -m tests.distributed_run WORKDIR WRITES.json

Every file operation that changes something under WORKDIR is recorded through an audit hook
(Python-level writes: the trainer's own files; orbax's tensorstore writes are native code and go
unseen) and saved to WRITES.json, so the test can tell which process wrote what.
"""

from __future__ import annotations

import json
import os
import sys

import jax

from intraskill_jax import distributed, runconfig
from intraskill_jax.models.sharding import make_mesh

from tests.runs import SMOKE

# A short run that still has every part the processes must agree on: a fresh policy exported by
# one writer, GRPO steps over the global mesh, a gate's rollouts, fit and bank, the final export.
OVERRIDES = {"train.rounds": 1, "train.gate_every": 2, "skills.validation_tasks": 16,
             "mesh.data": 1, "mesh.fsdp": -1, "mesh.tensor": 1}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_CHANGES = {"os.rename": 2, "os.remove": 1, "os.rmdir": 1, "os.mkdir": 1, "shutil.rmtree": 1, "os.truncate": 1,
            "os.symlink": 2, "os.link": 2}  # event -> how many of its first arguments are paths


def record_writes(root: str) -> list[list[str]]:
    """Starts recording changes under `root`; returns the list the records are appended to."""
    root = os.path.realpath(root) + os.sep
    writes: list[list[str]] = []

    def under(path: object) -> str | None:
        if not isinstance(path, (str, bytes, os.PathLike)):
            return None
        real = os.path.realpath(os.fsdecode(path))
        return real[len(root):] if (real + os.sep).startswith(root) else None

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = args
            writing = any(c in mode for c in "wax+") if isinstance(mode, str) else bool(flags & _WRITE_FLAGS)
            if writing and (rel := under(path)) is not None:
                writes.append([event, rel])
        elif event in _CHANGES:
            for path in args[: _CHANGES[event]]:
                if (rel := under(path)) is not None:
                    writes.append([event, rel])

    sys.addaudithook(hook)
    return writes


def main(workdir: str, writes_path: str) -> None:
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
    distributed.maybe_initialize(timeout_s=120)
    from intraskill_jax.coevolve import Coevolution

    os.makedirs(workdir, exist_ok=True)
    writes = record_writes(workdir)
    config = runconfig.with_overrides(runconfig.load_file(SMOKE), OVERRIDES)
    # Several processes take the run's own mesh (policy.default_mesh); one CPU process would take
    # none, so the reference is given the same mesh over its 8 devices.
    mesh = None if distributed.is_multiprocess() else make_mesh(config.mesh)
    run = Coevolution.start(config, workdir, progress=False, mesh=mesh)
    try:
        run.run()
    finally:
        run.close()
    distributed.sync("trained")
    with open(writes_path, "w") as f:
        json.dump({"process": jax.process_index(), "processes": jax.process_count(), "writes": writes}, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
