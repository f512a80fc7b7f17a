"""Test-wide settings, read by XLA once at backend start-up, so set before anything imports jax.

* Eight fake CPU devices let every sharding test run on a laptop or CI.
* LLVM optimisation level 0: the suite is dominated by XLA compile time on tiny shapes, and level 0
  compiles CPU programs about 2.5x faster; the tests compare against references with tolerances.
* One persistent XLA compilation cache for the session, shared by both workers and by the runs that
  tests start as subprocesses: many tests compile the same programs (the same tiny models at the
  same shapes), and a hit skips XLA's compile (tests/models with tests/rl/test_train_step.py: 334 s
  without it, 285 s from an empty one). A cache named in JAX_COMPILATION_CACHE_DIR is used as given.
* One OpenBLAS thread: XLA:CPU runs the chunked DeltaNet's triangular solve through OpenBLAS, whose
  own threads fight XLA's for the cores (a 7 ms solve took 1-3 s). OpenBLAS reads this when it
  loads, so it must precede the first numpy import.
"""

import atexit
import os
import shutil
import sys
import tempfile

if "numpy" not in sys.modules:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    _flags += " --xla_force_host_platform_device_count=8"
if "xla_backend_optimization_level" not in _flags:
    _flags += " --xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = _flags.strip()
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:  # the workers inherit the controller's
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="intraskill-tests-xla-")
    atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import pytest  # noqa: E402  (after the environment above, which must precede jax)

# Files that take one worker half an hour: collected first, so the other worker runs the rest of the
# suite meanwhile instead of both waiting on them at the end (xdist's loadfile hands out files in
# collection order).
LONGEST_FIRST = ("tests/test_smollm2_run.py",)


def pytest_collection_modifyitems(items):
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONGEST_FIRST)  # stable: the rest keep their order


@pytest.fixture(scope="session")
def smoke_reference(tmp_path_factory):
    """The smoke config trained once, uninterrupted (configs/quickstart.py:smoke): the run that the
    end-to-end tests evaluate and report on, and that killed-and-resumed runs must end as."""
    from intraskill_jax.coevolve import Coevolution
    from tests.runs import smoke_config

    workdir = tmp_path_factory.mktemp("reference")
    config = smoke_config()
    run = Coevolution.start(config, workdir, progress=False)
    try:
        run.run()
    finally:
        run.close()
    return config, workdir


@pytest.fixture(scope="module", autouse=True)
def release_compiled_programs():
    """Drops the programs a test module compiled once it is done. XLA:CPU maps each compiled
    program's code into memory regions of its own, and a process may hold vm.max_map_count of them
    (65,530 by default): the sampler tests alone reached it, and the compiler then crashed (a
    segfault) in whichever test came next. Cleared programs give their regions back for reuse."""
    yield
    import jax

    jax.clear_caches()
