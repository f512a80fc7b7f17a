"""What a run ran on and how long each stage took: `<workdir>/provenance.jsonl`.

    provenance.record_session(workdir, "train", world)      # once per command that trains or evaluates
    with provenance.stage(workdir, "gate", round=r):         # one row per stage it times
        ...

Two kinds of rows, appended as a command goes (a resumed run adds its own):

    {"kind": "session", "command", "started", "python", "packages", "platform", "machine",
     "devices", "processes", "git", "splits", "catalog"}
    {"kind": "stage", "stage", "seconds", "ended", ...details (round, steps, condition)}

The report's protocol chapter reads them from the bundle (software versions, machine, the wall
time of each stage), so a reader can tell what produced a figure without the run directory. The
file is rewritten whole at each row (a handful per run), which is atomic locally and on gs://.
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from intraskill_jax import rundir

# The packages whose versions decide the numbers: the trainer, its numerics, its statistics.
PACKAGES = ("intraskill-jax", "jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "scipy",
            "statsmodels", "transformers", "tokenizers", "bm25s", "rapidfuzz", "matplotlib")
_REPO = Path(__file__).resolve().parent.parent


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def append(workdir: rundir.PathLike, row: Mapping[str, Any]) -> None:
    """Adds one row to the run's provenance.jsonl (process 0 writes; every process calls)."""
    path = rundir.provenance_path(workdir)
    rows = rundir.read_jsonl(path) if path.is_file() else []
    rundir.write_jsonl(path, [*rows, rundir.json_finite(dict(row))])


def versions() -> dict[str, str | None]:
    """Installed version of each of `PACKAGES` (None when absent)."""
    out: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def machine() -> dict[str, Any]:
    """The host: OS, CPU architecture and count, memory, and the accelerators JAX sees."""
    info: dict[str, Any] = {"system": platform.system(), "release": platform.release(),
                            "architecture": platform.machine(), "cpus": os.cpu_count()}
    try:
        info["memory_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not every OS names these
        info["memory_gib"] = None
    return info


def devices() -> dict[str, Any]:
    """JAX's backend, device kind and count over every process (empty when JAX is not loaded:
    a command that never imported it ran on no accelerator)."""
    if "jax" not in sys.modules:
        return {}
    import jax

    devs = jax.devices()
    return {"backend": jax.default_backend(), "kind": devs[0].device_kind if devs else None,
            "count": len(devs), "processes": jax.process_count()}


def git_commit() -> dict[str, Any]:
    """The source's commit and whether the tree had changes, when it runs from a git checkout."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(_REPO), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    if commit is None:
        return {"commit": None, "dirty": None}
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def record_session(workdir: rundir.PathLike, command: str, world: Any = None) -> None:
    """Appends a session row: versions, machine, devices, source commit, and (given the shop's
    `world`) the size of each task split and of the catalog."""
    row: dict[str, Any] = {
        "kind": "session", "command": command, "started": _now(),
        "python": platform.python_version(), "packages": versions(), "platform": platform.platform(),
        "machine": machine(), "devices": devices(), "git": git_commit(),
    }
    if world is not None:
        row["splits"] = {name: int(len(world.splits[name])) for name in ("train", "validation", "test")}
        row["catalog"] = {"products": int(len(world.catalog)), "tasks": int(len(world.catalog.tasks)),
                          "lang": world.config.catalog.lang}
    append(workdir, row)


def record_stage(workdir: rundir.PathLike, name: str, seconds: float, **details: Any) -> None:
    append(workdir, {"kind": "stage", "stage": name, "seconds": round(float(seconds), 3), "ended": _now(), **details})


@contextlib.contextmanager
def stage(workdir: rundir.PathLike, name: str, **details: Any) -> Iterator[None]:
    """Times the block and appends its stage row when it finishes (not when it raises: a stage cut
    short has no wall time to report)."""
    started = time.perf_counter()
    yield
    record_stage(workdir, name, time.perf_counter() - started, **details)
