"""Multi-process JAX: which environments join a process group, a two-process GRPO step that equals
the single-device one, and a two-process training run with one writer whose files are the
single-process run's.

The two-process tests start workers under `jax.distributed` on 127.0.0.1 (4 fake CPU devices
each, gloo collectives), so the mesh crosses the process boundary and every reduction goes over
the wire: `tests/distributed_worker.py` (one GRPO step, host-side episodes handed out by process 0,
one rundir write) and `tests/distributed_run.py` (the co-evolution loop in a shared workdir).
"""

from __future__ import annotations

import hashlib
import json
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
from tests import distributed_run
from tests import distributed_worker as worker
from tests.http_util import free_port

REPO = Path(__file__).resolve().parents[1]
# The deadline catches a hang (a lone survivor waiting at a barrier), not slowness: the three-process
# run takes ~7 min beside the suite's other worker and passed 480 s once the cores were shared more.
WORKER_DEADLINE_S = 900


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


def _worker_env(process_id: int | None, port: int, devices: int = 4) -> dict[str, str]:
    """The environment of process `process_id` of two (None: a single process with `devices`)."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("INTRASKILL_", "SLURM_", "OMPI_", "TPU_", "MEGASCALE_", "JAX_"))}
    env.update(
        JAX_PLATFORMS="cpu", OPENBLAS_NUM_THREADS="1",
        # Same XLA options as this process (tests/conftest.py) except the device count.
        XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    if process_id is not None:
        # Different string hashes per process: a decision that followed set order would diverge.
        env.update(INTRASKILL_NUM_PROCESSES="2", INTRASKILL_PROCESS_ID=str(process_id),
                   INTRASKILL_COORDINATOR=f"127.0.0.1:{port}", PYTHONHASHSEED=str(process_id + 1))
    return env


def _tail(path: Path, chars: int = 4000) -> str:
    text = path.read_text(errors="replace") if path.exists() else "(no output)"
    # Gloo's connection chatter buries the traceback; keep what matters.
    lines = [line for line in text.splitlines() if not line.startswith("[Gloo]")]
    return "\n".join(lines)[-chars:]


def _run_all(tmp_path: Path, jobs: list[tuple[list[str], dict[str, str]]]) -> None:
    """Runs `jobs` (argv after `python -m`, environment) at once to completion; on a failure or the
    deadline, kills the rest and fails with every job's output (a lone survivor would otherwise
    wait at a barrier for minutes)."""
    logs = [tmp_path / f"job{i}.log" for i in range(len(jobs))]
    procs = []
    for (argv, env), log in zip(jobs, logs):
        with open(log, "w") as out:
            procs.append(subprocess.Popen([sys.executable, "-m", *argv], cwd=REPO, env=env, stdout=out,
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
    if any(codes):
        report = "\n".join(f"--- {' '.join(jobs[i][0])} (exit {codes[i]}) ---\n{_tail(logs[i])}"
                           for i in range(len(jobs)))
        pytest.fail(f"workers failed or passed the {WORKER_DEADLINE_S} s deadline:\n{report}")


def _run_workers(tmp_path: Path) -> list[Path]:
    port = free_port()
    outs = [tmp_path / f"worker{i}.npz" for i in range(2)]
    _run_all(tmp_path, [(["tests.distributed_worker", str(outs[i]), str(tmp_path / "shared")], _worker_env(i, port))
                        for i in range(2)])
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
        # Episodes from a host-side engine are process 0's on both (its script names its process).
        assert str(got.pop("episodes")) == json.dumps(worker.SCRIPTED_REPLY.format(process=0))
        got = {k: v for k, v in got.items() if k.startswith(("initial", "params", "metrics"))}
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
    # One rundir write, by process 0 alone, seen whole by both before either went on.
    assert json.loads((tmp_path / "shared" / "record.json").read_text()) == {"written_by": 0}
    for i, path in enumerate(outs):
        got = dict(np.load(path))
        # Process 0's failure raised on both: its own error there, a RuntimeError naming it here.
        assert str(got["from_main_error"]) == ("KeyError: 'raised on process 0'" if i == 0 else
                                               "RuntimeError: process 0 failed: KeyError('raised on process 0')")
        assert "inside a from_main function" in str(got["nested_collective"])
        assert bool(got["big_ok"])
        # Process 0 alone told the server (pause, flush, load, continue); both know the version.
        assert str(got["posts"]) == ("/pause_generation,/flush_cache,/update_weights_from_disk,/continue_generation"
                                     if i == 0 else "")
        assert int(got["weight_version"]) == 3
        assert str(got["published"]) == "from 0" and bool(got["removed"])


CHECKPOINTS = ("checkpoints/", "sft/checkpoints/")  # orbax's, the run's and the warm start's


def _files(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _assert_same_weights_to_the_ulp(got: Path, want: Path, max_ulp: int = 4) -> None:
    """The same tensors, each element within `max_ulp` float steps of the tensor's largest magnitude.
    On an Intel Xeon the gathered exports are byte for byte the single process's; on an AMD EPYC
    with AVX2 alone the SFT update summed the head's gradient in another order across processes,
    and 2,503 of its 201,464 elements came out apart by at most 3.7e-9 (half a step of its largest,
    0.085), every episode and decision after that the same."""
    from safetensors.numpy import load_file

    a, b = load_file(got), load_file(want)
    assert a.keys() == b.keys(), got
    for name in b:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, (got, name)
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        bound = max_ulp * float(np.spacing(np.abs(b[name]).max()))
        assert np.abs(x - y).max() <= bound, (got, name, float(np.abs(x - y).max()), bound)


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(WORKER_DEADLINE_S + 120)
def test_two_process_run_has_one_writer_and_the_single_process_files(tmp_path):
    """Two processes training in one workdir (fresh policy, warm start, GRPO steps on the 8-device
    mesh, a gate, the final export) leave the files one process with the same 8 devices leaves: one
    writer, the same episodes and decisions, and exports gathered across processes that are the
    single process's (byte for byte, or within a few ulps where the CPU sums in another order)."""
    port = free_port()
    run, reference = tmp_path / "run", tmp_path / "reference"
    jobs = [(["tests.distributed_run", str(run), str(tmp_path / f"writes{i}.json")], _worker_env(i, port))
            for i in range(2)]
    jobs.append((["tests.distributed_run", str(reference), str(tmp_path / "writes_ref.json")],
                 _worker_env(None, port, devices=8)))
    _run_all(tmp_path, jobs)
    writes = [json.loads((tmp_path / f"writes{i}.json").read_text()) for i in range(2)]
    assert [(w["process"], w["processes"]) for w in writes] == [(0, 2), (1, 2)]
    # Process 0 wrote the run; process 1 nothing but orbax's own per-process checkpoint metadata.
    assert {rel.split("/")[0] for _, rel in writes[0]["writes"]} >= {"config.json", "metrics.jsonl", "tb", "base", "sft",
                                                                        "hf", "skills", "gates", "rollouts"}
    strays = [(event, rel) for event, rel in writes[1]["writes"]
              if not (rel.startswith(CHECKPOINTS) and rel.endswith("/array_metadatas/process_1"))]
    assert strays == [], strays
    # The same files as one process's run, each byte for byte, but for what differs by design:
    # orbax's checkpoint internals (per-process names, timestamps), wall-clock metrics, event files,
    # the provenance (stage wall times, the process count).
    def comparable(files):
        return {k: v for k, v in files.items()
                if not k.startswith((*CHECKPOINTS, "tb/", "sft/tb/"))
                and k not in ("metrics.jsonl", "sft/metrics.jsonl", "provenance.jsonl")}

    got, want = comparable(_files(run)), comparable(_files(reference))
    assert {"base/model.safetensors", "sft/hf/model.safetensors", "hf/final/model.safetensors",
            "gates/round_0.json", "skills/round_1/ledger.json"} <= want.keys()
    assert got.keys() == want.keys()
    differ = [k for k in want if got[k] != want[k]]
    assert [k for k in differ if not k.endswith(".safetensors")] == []
    for rel in differ:
        _assert_same_weights_to_the_ulp(run / rel, reference / rel)
    assert len(list((run / "tb").iterdir())) == len(list((reference / "tb").iterdir())) == 1
    steps = distributed_run.OVERRIDES["train.gate_every"] * distributed_run.OVERRIDES["train.rounds"]
    for name in ("metrics.jsonl", "sft/metrics.jsonl"):  # the same rows, up to wall-clock figures
        rows = [[json.loads(line) for line in (d / name).read_text().splitlines()] for d in (run, reference)]
        assert [r["step"] for r in rows[0]] == [r["step"] for r in rows[1]]
        for a, b in zip(*rows):
            a, b = ({k: v for k, v in r.items() if not k.startswith("perf/")} for r in (a, b))
            assert a == pytest.approx(b, rel=1e-4), name
    assert max(json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()) == steps
    # The warm start trained on the mesh across both processes, so its export gathered weights that
    # moved. (The smoke policy scores 0 in every GRPO group, so its steps admit nothing: the GRPO
    # update across processes is the test above's.)
    assert (run / "sft/hf/model.safetensors").read_bytes() != (run / "base/model.safetensors").read_bytes()
