"""The host memory allocator: entry points re-run themselves with tcmalloc or jemalloc when found.

XLA:CPU allocates all of an execution's temporaries as one block, from the thread that runs it:
~670 MB for a quickstart-sized training step ([8, 1024] tokens). glibc serves a block that large
from a fresh `mmap` and unmaps it when freed, so every step faults its whole working set in anew
(~164K page faults, ~0.4 s of kernel time per step on two cores). tcmalloc keeps freed memory for
reuse, as does jemalloc told to (`MALLOC_CONF` below); with tcmalloc preloaded the training step
of `python -m intraskill_jax.bench.model --size quickstart` ran 1.2-1.6x and its prefill ~2x
faster on this project's 2-core machine (docs/performance.md, Models). glibc has no run-time
setting that does the same: its non-main arenas map large blocks whatever `M_MMAP_MAX` says, and
one arena for all threads (`M_ARENA_MAX=1`) gained ~10% with more CPU time.

A preload must be in the environment when the process starts, so `ensure()` re-executes the
same command line (same PID, same file descriptors) once, before any work, with `LD_PRELOAD`
set (PyTorch's CPU launcher, `torch.backends.xeon.run_cpu`, starts programs with it preloaded
too). It runs only where it is called (the `intraskill` command and the benchmarks' mains), never
on import, and restores `LD_PRELOAD` and `MALLOC_CONF` in the new process so that child processes
start as they would have.

`INTRASKILL_ALLOCATOR`: `auto` (default: tcmalloc, else jemalloc, else glibc), `tcmalloc`,
`jemalloc` or `system` (no re-execution).
"""

from __future__ import annotations

import ctypes.util
import gc
import os
import sys

ENV = "INTRASKILL_ALLOCATOR"
CHOICES = ("auto", "tcmalloc", "jemalloc", "system")
_ACTIVE = "_INTRASKILL_ALLOCATOR_ACTIVE"  # "<pid> <name> <library>", set for the re-executed process
_SAVED = "_INTRASKILL_SAVED_"  # prefix of the caller's values of the variables the preload sets
_LIBRARIES = {"tcmalloc": ("tcmalloc_minimal", "tcmalloc"), "jemalloc": ("jemalloc",)}
# Variables each allocator reads at start-up: tcmalloc would report every block over 1 GiB on
# stderr; jemalloc would return large blocks at once (its default for blocks over 8 MB).
_SETTINGS = {
    "tcmalloc": {"TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD": str(1 << 40)},
    "jemalloc": {"MALLOC_CONF": "oversize_threshold:0,dirty_decay_ms:30000,muzzy_decay_ms:30000"},
}
INSTALL_HINT = ("apt-get install libtcmalloc-minimal4 (Debian/Ubuntu): CPU training steps 1.2-1.6x, "
                "prefill ~2x faster")


def find(name: str) -> str | None:
    """The shared library of allocator `name` the dynamic loader would load, or None."""
    for lib in _LIBRARIES[name]:
        found = ctypes.util.find_library(lib)
        if found:
            return found
    return None


def _choice() -> str:
    choice = os.environ.get(ENV, "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise SystemExit(f"{ENV}={choice!r}: expected one of {', '.join(CHOICES)}")
    return choice


def _caller_preload() -> str:
    """An allocator the caller preloaded itself (LD_PRELOAD naming a malloc), or ''."""
    preload = os.environ.get("LD_PRELOAD", "")
    return preload if "malloc" in preload else ""


def _marker() -> tuple[str, str] | None:
    """(name, library) preloaded for this very process, or None. The marker names the PID it was
    set for (an exec keeps the PID), so a child process that inherits it decides for itself."""
    pid, _, rest = os.environ.get(_ACTIVE, "").partition(" ")
    if pid != str(os.getpid()):
        return None
    name, _, library = rest.partition(" ")
    return name, library


def active() -> str:
    """The allocator this process runs with: 'tcmalloc' or 'jemalloc' (preloaded by `ensure()` or
    by the caller's own LD_PRELOAD, which `ensure()` leaves alone), else 'system' (glibc's)."""
    marker = _marker()
    if marker:
        return marker[0]
    preload = _caller_preload()
    return next((name for name, libs in _LIBRARIES.items() if any(lib in preload for lib in libs)), "system")


def ensure() -> None:
    """Re-executes this process with tcmalloc or jemalloc preloaded (see the module docstring);
    returns at once where there is nothing to do: not Linux, already done, `system` chosen, a
    preload the caller set, or no such library installed."""
    marker = _marker()
    if marker:
        _restore(*marker)
        return
    choice = _choice()
    if choice == "system" or not sys.platform.startswith("linux") or _caller_preload():
        return
    names = ("tcmalloc", "jemalloc") if choice == "auto" else (choice,)
    found = next(((name, lib) for name in names if (lib := find(name))), None)
    if found is None:
        if choice != "auto":
            raise SystemExit(f"{ENV}={choice}: lib{_LIBRARIES[choice][0]} not found; install it or use auto")
        return
    name, library = found
    preload = os.environ.get("LD_PRELOAD", "")
    env = dict(os.environ)
    for var in ("LD_PRELOAD", *_SETTINGS[name]):
        if var in os.environ:
            env[_SAVED + var] = os.environ[var]
    env.update(_SETTINGS[name], LD_PRELOAD=f"{library}:{preload}" if preload else library)
    env[_ACTIVE] = f"{os.getpid()} {name} {library}"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, sys.orig_argv, env)


def release_free_memory() -> None:
    """Frees what only reference cycles still hold (a finished stage's objects: the co-evolution
    loop and its learner refer to each other, so its model, optimizer state and sampler cache
    outlive it until Python's cyclic collector happens to run), then hands the memory the allocator
    holds free back to the system (tcmalloc's page heap, glibc's trimmable top). Called after a
    stage whose peak the next one does not need (the warm start before the loop, the loop before the
    evaluation), so the next one's allocations do not stack on top of it."""
    gc.collect()
    libc = ctypes.CDLL(None)
    name = active()
    if name == "tcmalloc" and hasattr(libc, "MallocExtension_ReleaseFreeMemory"):
        libc.MallocExtension_ReleaseFreeMemory()
    elif name == "system" and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def _restore(name: str, library: str) -> None:
    """In the re-executed process: the caller's environment again, for child processes (which
    then decide for themselves). Idempotent: once restored, LD_PRELOAD no longer starts with ours."""
    if not os.environ.get("LD_PRELOAD", "").startswith(library):
        return
    for var in ("LD_PRELOAD", *_SETTINGS[name]):
        saved = os.environ.pop(_SAVED + var, None)
        if saved is None:
            os.environ.pop(var, None)
        else:
            os.environ[var] = saved


def describe() -> str:
    """One line for logs: the allocator in use, and how to get a faster one where there is none."""
    marker = _marker()
    if marker:
        return f"host allocator: {marker[0]} ({marker[1]}, preloaded; {ENV}=system turns it off)"
    preload = _caller_preload()
    if preload:
        return f"host allocator: preloaded by the caller ({preload})"
    return f"host allocator: glibc malloc; {INSTALL_HINT}"
