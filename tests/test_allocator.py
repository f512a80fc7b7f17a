"""The host allocator: a program re-executes itself once with tcmalloc preloaded, same PID, and
hands its children the environment it was started with; a finished training loop is freed before
the next stage."""

import gc
import os
import subprocess
import sys
import types
import weakref

import pytest

from intraskill_jax import allocator

# Prints the PID before and after `ensure()` (an exec keeps it and runs the lines before again),
# what is mapped and what the environment holds afterwards, and what a child process decides.
PROBE = """
import os, subprocess, sys
print("pid", os.getpid(), flush=True)
from intraskill_jax import allocator
allocator.ensure()
maps = open("/proc/self/maps").read()
print("pid", os.getpid())
print("active", allocator.active())
print("mapped", "tcmalloc" in maps, "jemalloc" in maps)
print("env", os.environ.get("LD_PRELOAD"), os.environ.get("TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD"))
child = "import os; from intraskill_jax import allocator; print(allocator.active(), os.environ.get('LD_PRELOAD'))"
print("child", subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, check=True).stdout.strip())
"""


def _probe(choice: str, **extra: str) -> dict[str, list[str]]:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", allocator.ENV)}
    env.update({allocator.ENV: choice, **extra})
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    lines: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        key, _, rest = line.partition(" ")
        lines.setdefault(key, []).append(rest)
    return lines


needs_tcmalloc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or allocator.find("tcmalloc") is None,
    reason="libtcmalloc not installed: apt-get install libtcmalloc-minimal4 (.ci/run installs it as root)")


@needs_tcmalloc
def test_auto_reexecutes_once_with_tcmalloc_and_restores_the_environment_for_children():
    out = _probe("auto")
    # the line before ensure() printed twice (executed once more), all by one PID
    assert len(out["pid"]) == 3 and len(set(out["pid"])) == 1
    assert out["active"] == ["tcmalloc"]
    assert out["mapped"] == ["True False"]
    assert out["env"] == ["None None"]  # LD_PRELOAD and tcmalloc's setting gone again
    assert out["child"] == ["system None"]  # a child starts with the caller's environment


@needs_tcmalloc
def test_a_callers_allocator_setting_is_restored_for_children():
    out = _probe("auto", TCMALLOC_LARGE_ALLOC_REPORT_THRESHOLD="123")
    assert out["active"] == ["tcmalloc"]
    assert out["env"] == ["None 123"]


@needs_tcmalloc
def test_a_callers_own_preload_is_kept_and_reported():
    """`LD_PRELOAD=libtcmalloc... python -m intraskill_jax.bench...`: no re-execution, and the
    benchmarks' JSON names the allocator that runs, not 'system'."""
    library = allocator.find("tcmalloc")
    out = _probe("auto", LD_PRELOAD=library)
    assert len(out["pid"]) == 2  # ensure() did not execute the program again
    assert out["active"] == ["tcmalloc"]
    assert out["mapped"] == ["True False"]
    assert out["env"] == [f"{library} None"]


def test_system_runs_with_glibc_and_no_reexecution():
    out = _probe("system")
    assert out["active"] == ["system"]
    assert out["mapped"] == ["False False"]
    assert out["env"] == ["None None"]


def test_a_bad_choice_is_one_clear_error():
    env = {**os.environ, allocator.ENV: "tcmaloc"}
    done = subprocess.run([sys.executable, "-c", "from intraskill_jax import allocator; allocator.ensure()"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 1
    assert "INTRASKILL_ALLOCATOR='tcmaloc': expected one of auto, tcmalloc, jemalloc, system" in done.stderr


class _Loop:
    """A finished training loop as `Coevolution` is one: it and its learner refer to each other."""

    def __init__(self):
        self.learner = types.SimpleNamespace(on_step=self.run)

    def run(self):
        return types.SimpleNamespace(name="round_1", active=[])

    def close(self):
        pass


def test_training_frees_its_loop_before_returning(monkeypatch, tmp_path):
    """`intraskill train` / `quickstart`: the loop (its model, optimizer state and sampler cache in a
    real run) is gone when training returns, before the evaluation allocates its own; a reference
    cycle alone would keep it until Python's cyclic collector happened to run."""
    from intraskill_jax import coevolve, main

    started = []

    def start(*args, **kwargs):
        loop = _Loop()
        started.append(weakref.ref(loop))
        return loop

    monkeypatch.setattr(coevolve.Coevolution, "start", start)
    gc.disable()  # the collector running on its own would hide a missing collection
    try:
        main._train(None, tmp_path, types.SimpleNamespace(write=lambda text: None))
        assert started and started[0]() is None
    finally:
        gc.enable()
