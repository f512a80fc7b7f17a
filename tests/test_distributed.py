"""Multi-process JAX: which environments join a process group, and a two-process GRPO step that
equals the single-device one.

The two-process test starts `tests/distributed_worker.py` twice under `jax.distributed` on
127.0.0.1 (4 fake CPU devices each, gloo collectives), so the mesh's 'data' axis crosses the
process boundary and every gradient reduction goes over the wire. Both workers' gathered
parameters must match the update computed here on one device.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from intraskill_jax import distributed
from intraskill_jax.models import sharding
from tests import distributed_worker as worker
from tests.http_util import free_port

REPO = Path(__file__).resolve().parents[1]
WORKER_DEADLINE_S = 480


# -- which environments ask for several processes -------------------------------------------------


@pytest.mark.parametrize("env", [
    {},
    {"INTRASKILL_NUM_PROCESSES": "1", "SLURM_NTASKS": "4"},  # explicit single process wins
    {"INTRASKILL_DISTRIBUTED": "off", "SLURM_NTASKS": "4"},
    {"SLURM_NTASKS": "1", "OMPI_COMM_WORLD_SIZE": "1"},
    {"TPU_WORKER_HOSTNAMES": "t1v-n-0"},
    {"MEGASCALE_NUM_SLICES": "1"},
], ids=["empty", "explicit-1", "off", "slurm-1", "gke-1-host", "one-slice"])
def test_single_process_environments(env):
    assert distributed.detect(env) is None


def test_explicit_group():
    group = distributed.detect({"INTRASKILL_NUM_PROCESSES": "4", "INTRASKILL_PROCESS_ID": "3",
                                "INTRASKILL_COORDINATOR": "10.0.0.2:1234", "SLURM_NTASKS": "8"})
    assert group == distributed.ProcessGroup(source="INTRASKILL_NUM_PROCESSES", coordinator="10.0.0.2:1234",
                                             num_processes=4, process_id=3)


@pytest.mark.parametrize("env,source", [
    ({"INTRASKILL_DISTRIBUTED": "auto"}, "INTRASKILL_DISTRIBUTED=auto"),
    ({"SLURM_NTASKS": "16"}, "SLURM_NTASKS"),
    ({"OMPI_COMM_WORLD_SIZE": "2"}, "OMPI_COMM_WORLD_SIZE"),
    ({"TPU_WORKER_HOSTNAMES": "t1v-n-0,t1v-n-1"}, "TPU_WORKER_HOSTNAMES"),
    ({"MEGASCALE_NUM_SLICES": "2"}, "MEGASCALE_NUM_SLICES"),
])
def test_launcher_environments_leave_the_values_to_jax(env, source):
    assert distributed.detect(env) == distributed.ProcessGroup(source=source)


@pytest.mark.parametrize("env,match", [
    ({"INTRASKILL_NUM_PROCESSES": "2", "INTRASKILL_COORDINATOR": "h:1"}, "INTRASKILL_PROCESS_ID"),
    ({"INTRASKILL_NUM_PROCESSES": "2", "INTRASKILL_PROCESS_ID": "2", "INTRASKILL_COORDINATOR": "h:1"},
     r"INTRASKILL_PROCESS_ID in \[0, 1\]"),
    ({"INTRASKILL_NUM_PROCESSES": "2", "INTRASKILL_PROCESS_ID": "0"}, "INTRASKILL_COORDINATOR=host:port"),
    ({"INTRASKILL_NUM_PROCESSES": "2", "INTRASKILL_PROCESS_ID": "0", "INTRASKILL_COORDINATOR": "h"},
     "host:port"),
    ({"INTRASKILL_NUM_PROCESSES": "two"}, "not an integer"),
    ({"INTRASKILL_NUM_PROCESSES": "0"}, ">= 1"),
    ({"INTRASKILL_DISTRIBUTED": "yes"}, "'auto'"),
])
def test_bad_environment_names_the_variable(env, match):
    with pytest.raises(ValueError, match=match):
        distributed.detect(env)


def test_single_process_helpers():
    assert distributed.maybe_initialize({}) is False and not jax.distributed.is_initialized()
    assert distributed.is_main_process()
    distributed.sync("alone")  # no peers: returns at once
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=-1))
    x = jax.device_put(np.arange(16.0).reshape(8, 2), sharding.batch_sharding(mesh))
    gathered = distributed.gather_to_host({"x": x, "n": 3})
    assert isinstance(gathered["x"], np.ndarray) and gathered["n"] == 3
    np.testing.assert_array_equal(gathered["x"], np.arange(16.0).reshape(8, 2))
    assert distributed.broadcast_from_main({"a": 1})["a"] == 1


# -- two processes, one sharded GRPO step -----------------------------------------------------------


def _worker_env(process_id: int, port: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INTRASKILL_", "SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_"))}
    env.update(
        INTRASKILL_NUM_PROCESSES="2", INTRASKILL_PROCESS_ID=str(process_id),
        INTRASKILL_COORDINATOR=f"127.0.0.1:{port}", JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1",
        # Same XLA options as this process (tests/conftest.py) except the device count.
        XLA_FLAGS="--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def _tail(path: Path, chars: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no output)"
    # Gloo's connection chatter buries the traceback; keep what matters.
    lines = [line for line in text.splitlines() if not line.startswith("[Gloo]")]
    return "\n".join(lines)[-chars:]


def _run_workers(tmp_path: Path) -> list[Path]:
    """Runs both workers to completion; on a failure or the deadline, kills the rest and fails
    with every worker's output (a lone survivor would otherwise wait at a barrier for minutes)."""
    port = free_port()
    outs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    logs = [tmp_path / f"worker{i}.log" for i in range(2)]
    procs = []
    for i in range(2):
        with open(logs[i], "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-m", "tests.distributed_worker", str(outs[i])],
                                          cwd=REPO, env=_worker_env(i, port), stdout=log,
                                          stderr=subprocess.STDOUT))
    deadline = time.monotonic() + WORKER_DEADLINE_S
    try:
        while True:
            codes = [p.poll() for p in procs]  # every process, so a dead one is seen at once
            if all(c is not None for c in codes) or any(c not in (None, 0) for c in codes):
                break
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = [p.returncode for p in procs]
    if codes != [0, 0]:
        report = "\n".join(f"--- worker {i} (exit {codes[i]}) ---\n{_tail(logs[i])}" for i in range(2))
        pytest.fail(f"distributed workers failed or passed the {WORKER_DEADLINE_S} s deadline:\n{report}")
    return outs


@pytest.mark.slow
@pytest.mark.timeout(WORKER_DEADLINE_S + 120)
def test_two_process_grpo_step_matches_one_device(tmp_path):
    outs = _run_workers(tmp_path)
    mesh = sharding.make_mesh(sharding.MeshConfig(fsdp=1), devices=jax.devices()[:1])
    initial, new_state, metrics = worker.grpo_update(mesh)
    reference = {**worker.flat(initial.params, "initial"), **worker.flat(new_state.params, "params"),
                 **worker.flat(metrics, "metrics")}
    for i, path in enumerate(outs):
        got = dict(np.load(path))
        assert int(got.pop("process_index")) == i
        assert int(got.pop("broadcast")[0]) == 7  # process 0's value reached process 1
        assert int(got.pop("cross_process_leaves")) > 0  # the update really spanned both processes
        assert got.keys() == reference.keys()
        for key, want in reference.items():
            if key.startswith("initial"):  # the same seed builds the same weights on any mesh
                np.testing.assert_array_equal(got[key], want, err_msg=f"worker {i}: {key}")
            elif key.startswith("params"):
                np.testing.assert_allclose(got[key], want, rtol=0, atol=1e-6, err_msg=f"worker {i}: {key}")
            else:
                np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-7, err_msg=f"worker {i}: {key}")
    # The update moved the weights, so equality above is not two copies of the initial state.
    moved = max(float(np.abs(reference[k] - reference["initial" + k[len("params"):]]).max())
                for k in reference if k.startswith("params"))
    assert moved > 1e-4
