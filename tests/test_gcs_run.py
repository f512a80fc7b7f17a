"""A run directory on gs://, for real: against a GCS emulator that the tests start on 127.0.0.1
(tests/gcs_emulator.py). The path layer's commit points and orbax's checkpoints on the object store,
then the smoke run trained on gs://bucket/run through a SIGKILL at each named phase, resumed to the
uninterrupted local run, reported and checked from there, with nothing written locally: killed
once in each stage from the base policy to the report (`tests.runs.KILLS`)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("gcsfs", reason="gs:// needs gcsfs (the gcs and test extras)")
pytest.importorskip("gcp_storage_emulator", reason="the gs:// tests need gcp-storage-emulator (the test extra)")

from intraskill_jax import rundir  # noqa: E402

from tests import checkpoint_run, runs  # noqa: E402
from tests.gcs_emulator import client_env  # noqa: E402

BUCKET = "bucket"


@pytest.fixture(scope="module")
def gcs():
    """The emulator, and this process pointed at it; yields the clients' environment."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "tests.gcs_emulator", str(port), BUCKET], cwd=runs.REPO,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert server.poll() is None and time.time() < deadline, "the GCS emulator did not start"
            time.sleep(0.1)
    env = client_env(port)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=30)


def test_record_files_and_published_directories_commit_on_the_object_store(gcs, tmp_path, monkeypatch):
    root = rundir.run_path(f"gs://{BUCKET}/records")
    rundir.write_json(rundir.gate_path(root, 0), {"beta": [0.5]})
    assert rundir.read_json(rundir.gate_path(root, 0)) == {"beta": [0.5]}
    log = rundir.JsonlLog(rundir.metrics_path(root))
    log.append({"step": 1})
    log.append({"step": 2})
    assert rundir.read_jsonl(rundir.metrics_path(root)) == [{"step": 1}, {"step": 2}]
    log.rewrite([{"step": 1}])
    rundir.JsonlLog(rundir.metrics_path(root)).append({"step": 3})  # a resumed run's log keeps the rows
    assert rundir.read_jsonl(rundir.metrics_path(root)) == [{"step": 1}, {"step": 3}]

    # The commit file goes up last: until then a reader sees no published directory.
    out = rundir.final_policy_dir(root)
    uploads = []
    copy = rundir._copy_file

    def watched(src, dst):
        uploads.append((Path(src).name, rundir.is_published(out)))
        copy(src, dst)

    monkeypatch.setattr(rundir, "_copy_file", watched)
    rundir.publish_dir(out, lambda tmp: [(tmp / n).write_text(n) for n in ("config.json", "model.safetensors")])
    assert uploads == [("config.json", False), ("model.safetensors", False), (rundir.COMMIT_MARKER, False)]
    assert rundir.is_published(out)
    rundir.publish_dir(out, lambda tmp: (tmp / "config.json").write_text("new"))
    assert rundir.list_files(out) == [rundir.COMMIT_MARKER, "config.json"]  # the old version is gone
    with rundir.local_dir(out, skip=("*.json",)) as local:
        staged = local
        assert os.listdir(local) == [rundir.COMMIT_MARKER]
    assert not staged.exists()  # the download is temporary
    assert not rundir.is_published(rundir.sft_policy_dir(root))


def test_orbax_checkpoints_resume_exactly_from_the_object_store(gcs, tmp_path):
    local = checkpoint_run.run(tmp_path, 3)
    remote = f"gs://{BUCKET}/ckpt"
    checkpoint_run.run(remote, 2)
    steps = sorted(p.name for p in rundir.checkpoints_dir(remote).iterdir())
    assert steps == ["1", "2"] and (rundir.checkpoints_dir(remote) / "2" / "commit_success.txt").is_file()
    # A step whose every file is up but its commit file (a kill just before it): never restored.
    unfinished = rundir.checkpoints_dir(remote) / "3"
    for rel in rundir.list_files(rundir.checkpoints_dir(remote) / "2"):
        if rel != "commit_success.txt":
            (unfinished / rel).write_bytes((rundir.checkpoints_dir(remote) / "2" / rel).read_bytes())
    resumed = checkpoint_run.run(remote, 3)  # restores step 2 from gs://, trains step 3
    expected, got = checkpoint_run.flat_arrays(local), checkpoint_run.flat_arrays(resumed)
    assert expected.keys() == got.keys()
    for key in expected:
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    assert (unfinished / "commit_success.txt").is_file()  # step 3 was written anew and committed


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_a_run_on_gs_survives_kills_and_reports_from_there(gcs, smoke_reference, tmp_path):
    config, reference = smoke_reference
    runs.finish(config, reference)
    workdir = f"gs://{BUCKET}/run"
    cwd = tmp_path / "cwd"  # the processes' working directory: it must stay empty
    cwd.mkdir()
    runs.run_through_kills(workdir, env=gcs, cwd=cwd)  # from nothing to the report, all on gs://
    runs.assert_same_run(reference, rundir.run_path(workdir), config)
    env = {**os.environ, **gcs, "PYTHONPATH": str(runs.REPO)}
    done = subprocess.run([sys.executable, "-m", "intraskill_jax.cli", "check-bundle", workdir], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"check-bundle: OK: {workdir}/bundle" in done.stdout
    listed = rundir.list_files(workdir)
    for rel in ("config.json", "metrics.jsonl", f"base/{rundir.COMMIT_MARKER}", f"sft/hf/{rundir.COMMIT_MARKER}",
                "sft/metrics.jsonl", f"hf/final/{rundir.COMMIT_MARKER}", "skills/round_2/ledger.json",
                "bundle/manifest.json", "report/index.html", "report/plots/training.svg"):
        assert rel in listed, rel
    assert any(rel.startswith("tb/events.out.tfevents") for rel in listed)
    assert any(rel.startswith("checkpoints/4/") for rel in listed)
    assert os.listdir(cwd) == [] and not (runs.REPO / "gs:").exists()
