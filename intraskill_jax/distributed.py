"""Several JAX processes (TPU pod workers, GPU hosts): when to join them, and the helpers a trainer needs.

JAX runs one Python process per host; the processes must join one distributed system before
the first JAX computation, after which `jax.devices()` lists every device of every process and
a mesh over them spans the whole slice. `maybe_initialize()` decides from the environment
whether there is more than one process, first match wins:

  INTRASKILL_NUM_PROCESSES=N, INTRASKILL_PROCESS_ID=i, INTRASKILL_COORDINATOR=host:port
      explicit; N > 1 joins N processes with process 0 serving at host:port (any launcher,
      e.g. GPU hosts without a scheduler); N = 1 forces a single process whatever else is set.
  INTRASKILL_DISTRIBUTED=auto | off
      auto: join, and let JAX find coordinator, count and id itself; off: one process.
      `launch_tpu.sh` sets auto on every worker of a TPU VM pod slice, where only the TPU
      metadata server (which JAX queries) knows the workers: no environment variable on a
      TPU VM says "pod".
  SLURM_NTASKS > 1, OMPI_COMM_WORLD_SIZE > 1, TPU_WORKER_HOSTNAMES / TPU_PROCESS_ADDRESSES
  listing several hosts (GKE TPU), MEGASCALE_NUM_SLICES > 1 (multislice)
      a launcher JAX understands started several processes: join with JAX's auto-detection.
  anything else
      one process; nothing is initialised (so single-host runs never wait for a coordinator).

JAX itself still reads JAX_COORDINATOR_PORT (port of the auto-detected coordinator) and
JAX_LOCAL_DEVICE_IDS (one process per GPU).

Use `maybe_initialize()` first thing in a command's main, before anything touches a device; a
mesh made after it spans every process's devices.

A run on several processes is one program in lockstep (SPMD): every process executes the same
host code, in the same order, on the same data, and the jitted programs over the global mesh are
collectives that all of them call together. What keeps the host side identical everywhere:

  * decisions draw from generators seeded by (seed, step or round), never from wall clocks;
  * episodes played by the embedded sampler are global computations whose results every process
    fetches; episodes from a host-side client (a rollout server) and analyst proposals (an LLM
    API) are made by process 0 alone and handed to the rest (`from_main`);
  * process 0 is the one writer of the run directory (`is_main_process`), and every write is
    bracketed by a barrier named after the path and an exchange of whether it failed (`rundir`):
    reads before a write see the directory without it on every process, reads after see it with
    it, a failed write raises everywhere, and a process that strays to another write fails the
    name check (one that strays into a different collective waits there, as any collective does);
  * an HF export gathers the sharded parameters on every process (`gather_to_host`, collective)
    before process 0 writes them.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import os
import pickle
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from jax.experimental import multihost_utils

log = logging.getLogger(__name__)

ENV_COORDINATOR = "INTRASKILL_COORDINATOR"
ENV_NUM_PROCESSES = "INTRASKILL_NUM_PROCESSES"
ENV_PROCESS_ID = "INTRASKILL_PROCESS_ID"
ENV_DISTRIBUTED = "INTRASKILL_DISTRIBUTED"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProcessGroup:
    """How to call `jax.distributed.initialize`: explicit values, or all None for JAX's detection.

    Attributes:
      source: the environment variable(s) that asked for several processes (for the log).
      coordinator: host:port of process 0's coordination service.
      num_processes, process_id: this process's place in the group.
    """

    source: str
    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not an integer; set it to a whole number or unset it.") from None


def _explicit(env: Mapping[str, str]) -> ProcessGroup | None:
    count = _int_env(env, ENV_NUM_PROCESSES)
    if count is None or count == 1:
        return None
    coordinator = env.get(ENV_COORDINATOR, "").strip()
    process_id = _int_env(env, ENV_PROCESS_ID)
    if count < 1:
        raise ValueError(f"{ENV_NUM_PROCESSES}={count} must be >= 1.")
    if process_id is None or not 0 <= process_id < count:
        raise ValueError(f"{ENV_NUM_PROCESSES}={count} needs {ENV_PROCESS_ID} in [0, {count - 1}] on each process; "
                         f"got {env.get(ENV_PROCESS_ID)!r}.")
    host, _, port = coordinator.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"{ENV_NUM_PROCESSES}={count} needs {ENV_COORDINATOR}=host:port (process 0's address, "
                         f"the same on every process); got {coordinator!r}.")
    return ProcessGroup(source=ENV_NUM_PROCESSES, coordinator=coordinator, num_processes=count,
                        process_id=process_id)


def _host_count(addresses: str) -> int:
    return len([a for a in addresses.split(",") if a.strip()])


def detect(env: Mapping[str, str] | None = None) -> ProcessGroup | None:
    """The process group the environment describes, or None for a single process (pure; no JAX)."""
    env = os.environ if env is None else env
    if env.get(ENV_NUM_PROCESSES, "").strip():
        return _explicit(env)
    mode = env.get(ENV_DISTRIBUTED, "").strip().lower()
    if mode not in ("", "auto", "off"):
        raise ValueError(f"{ENV_DISTRIBUTED}={mode!r}: expected 'auto' (join, JAX detects the cluster) or 'off'.")
    if mode == "off":
        return None
    if mode == "auto":
        return ProcessGroup(source=f"{ENV_DISTRIBUTED}=auto")
    # Launchers JAX can read itself; each asks for several processes in its own words.
    if (_int_env(env, "SLURM_NTASKS") or 1) > 1:
        return ProcessGroup(source="SLURM_NTASKS")
    if (_int_env(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
        return ProcessGroup(source="OMPI_COMM_WORLD_SIZE")
    for name in ("TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES"):
        if _host_count(env.get(name, "")) > 1:
            return ProcessGroup(source=name)
    if (_int_env(env, "MEGASCALE_NUM_SLICES") or 1) > 1:
        return ProcessGroup(source="MEGASCALE_NUM_SLICES")
    return None


def maybe_initialize(env: Mapping[str, str] | None = None, *, timeout_s: int = 300) -> bool:
    """Joins the distributed system when the environment asks for several processes.

    Call before any JAX computation (even `jax.devices()`): JAX fixes the device list when its
    backend starts. Safe to call again (a joined process stays joined). Returns True when this
    process is part of a multi-process group.

    Args:
      env: the environment to read (default: os.environ).
      timeout_s: how long to wait for every process to reach the coordinator.
    """
    group = detect(env)
    if group is None:
        log.debug("single JAX process (no multi-process environment found)")
        return False
    if jax.distributed.is_initialized():
        return True
    log.info("joining the JAX distributed system (%s): coordinator=%s processes=%s id=%s", group.source,
             group.coordinator or "auto", group.num_processes or "auto",
             "auto" if group.process_id is None else group.process_id)
    jax.distributed.initialize(coordinator_address=group.coordinator, num_processes=group.num_processes,
                               process_id=group.process_id, initialization_timeout=timeout_s)
    log.info("JAX process %d of %d: %d local devices, %d in all", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return True


def is_multiprocess() -> bool:
    """True in a group of several JAX processes (one joined through `maybe_initialize`)."""
    return jax.distributed.is_initialized() and jax.process_count() > 1


def is_main_process() -> bool:
    """True on process 0 (and on a single process): the one that writes the run directory."""
    return not is_multiprocess() or jax.process_index() == 0


# Set while process 0 runs a `from_main` function alone: a collective there would wait forever
# for processes that are not running it.
_MAIN_ONLY = contextvars.ContextVar("intraskill_main_only", default=False)


def _collective(name: str) -> bool:
    """Whether a collective must run (several processes); refuses one inside `from_main`."""
    if not is_multiprocess():
        return False
    if _MAIN_ONLY.get():
        raise RuntimeError(f"{name} inside a from_main function: process 0 runs it alone, so the other processes "
                           "would never join the collective")
    return True


def sync(name: str) -> None:
    """Barrier: returns once every process has called sync(name); fails when the other processes
    reached a barrier of another name (one strayed from the lockstep order). Against a process
    that is inside a different collective it waits, as every collective does."""
    if _collective(f"sync({name!r})"):
        multihost_utils.sync_global_devices(name)


def gather_to_host(tree: Any) -> Any:
    """Every array leaf as a whole NumPy array on every process (a collective: all must call it).

    Sharded arrays are gathered one leaf at a time, so the extra device memory is one replicated
    tensor rather than a replicated model.
    """
    _collective("gather_to_host")  # a collective on several processes: refused inside from_main

    def one(x: Any) -> Any:
        if not isinstance(x, jax.Array):
            return x
        if x.is_fully_addressable:
            return np.asarray(jax.device_get(x))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))

    return jax.tree.map(one, tree)


def broadcast_from_main(tree: Any) -> Any:
    """Process 0's values of the arrays in `tree` on every process (shapes and dtypes must match)."""
    if not _collective("broadcast_from_main"):
        return tree
    return multihost_utils.broadcast_one_to_all(tree)


def all_processes(flag: bool) -> list[bool]:
    """Every process's `flag`, in process order (a collective)."""
    if not _collective("all_processes"):
        return [bool(flag)]
    return [bool(x) for x in np.asarray(multihost_utils.process_allgather(np.array([flag], np.int32))).reshape(-1)]


BROADCAST_PIECE = 16 << 20  # bytes per broadcast of a pickled result: bounds device memory, few shapes


def _broadcast_bytes(payload: bytes) -> bytes:
    """Process 0's `payload` on every process: its length as 8 bytes, then pieces of at most
    `BROADCAST_PIECE` bytes, each padded to a power of two (>= 1 KiB) so the broadcast compiles
    for a handful of shapes. Bytes are summed with zeros, so no integer width limits the length."""
    header = np.frombuffer(len(payload).to_bytes(8, "little"), np.uint8)
    size = int.from_bytes(np.asarray(broadcast_from_main(header), np.uint8).tobytes(), "little")
    source = np.frombuffer(payload, np.uint8)
    pieces = []
    for start in range(0, size, BROADCAST_PIECE):
        n = min(BROADCAST_PIECE, size - start)
        padded = np.zeros(1 << max(10, (n - 1).bit_length()), np.uint8)
        padded[: len(source[start: start + n])] = source[start: start + n]
        pieces.append(np.asarray(broadcast_from_main(padded), np.uint8)[:n].tobytes())
    return b"".join(pieces)


def from_main(fn: Callable[[], T]) -> T:
    """`fn()` run on process 0 alone and its (picklable) result handed to every process.

    For host-side work whose result may differ between processes or must happen once: episodes
    from a rollout server, an analyst's LLM calls. `fn` must not call collectives (they raise
    here). When `fn` raises on process 0, every process raises (the others a RuntimeError
    naming process 0's error), so no process waits for a result that never comes. Nested calls
    run `fn` directly.
    """
    if not is_multiprocess() or _MAIN_ONLY.get():
        return fn()
    main = jax.process_index() == 0
    payload = b""
    if main:
        token = _MAIN_ONLY.set(True)
        try:
            outcome: tuple[bool, Any] = (True, fn())
        except Exception as e:  # handed to every process below, then raised everywhere
            outcome = (False, e)
        finally:
            _MAIN_ONLY.reset(token)
        try:
            payload = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:  # an unpicklable result or exception
            outcome = (False, RuntimeError(f"process 0's result of from_main does not pickle: {e!r}"))
            payload = pickle.dumps(outcome)
    received = _broadcast_bytes(payload)
    ok, value = outcome if main else pickle.loads(received)
    if not ok:
        if main:
            raise value
        raise RuntimeError(f"process 0 failed: {value!r}")
    return value
