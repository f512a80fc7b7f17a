"""The run directory's path layer, write helpers and crash points (local; gs:// is tests/test_gcs_run.py)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from intraskill_jax import rundir

from tests.runs import REPO


def test_run_paths_keep_urls_and_refuse_a_collapsed_one(tmp_path):
    url = rundir.run_path("gs://bucket/run")
    assert str(rundir.rollouts_path(url, 3)) == "gs://bucket/run/rollouts/step_000003.jsonl"
    assert rundir.is_remote(url) and not rundir.is_remote(tmp_path)
    assert str(rundir.ledger_path(tmp_path, 2)) == str(tmp_path / "skills" / "round_2" / "ledger.json")
    # pathlib turns gs://bucket/run into gs:/bucket/run, a local folder named `gs:`.
    with pytest.raises(ValueError, match="lost a slash.*gs://bucket/run"):
        rundir.run_path(Path("gs://bucket/run"))
    with pytest.raises(ValueError, match="not s3://"):
        rundir.run_path("s3://bucket/run")


def test_record_writes_are_whole_and_leave_no_temporary_file(tmp_path):
    path = rundir.write_json(tmp_path / "gates" / "round_0.json", {"beta": [0.5]})
    assert rundir.read_json(path) == {"beta": [0.5]}
    rundir.write_jsonl(tmp_path / "rollouts" / "step_000000.jsonl", [{"a": 1}, {"a": 2}])
    assert rundir.read_jsonl(tmp_path / "rollouts" / "step_000000.jsonl") == [{"a": 1}, {"a": 2}]
    assert sorted(rundir.list_files(tmp_path)) == ["gates/round_0.json", "rollouts/step_000000.jsonl"]
    assert rundir.gate_files(tmp_path) == {0: rundir.gate_path(tmp_path, 0)}
    assert list(rundir.rollout_files(tmp_path)) == [0]


def test_a_published_directory_appears_whole_or_not_at_all(tmp_path):
    out = tmp_path / "hf" / "final"

    def write(files):
        def fill(tmp: Path) -> None:
            for name, text in files.items():
                (tmp / name).write_text(text)
        return fill

    rundir.publish_dir(out, write({"config.json": "1", "model.safetensors": "a"}))
    assert rundir.is_published(out) and (out / rundir.COMMIT_MARKER).is_file()

    def fails(tmp: Path) -> None:
        (tmp / "config.json").write_text("2")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        rundir.publish_dir(out, fails)
    assert (out / "config.json").read_text() == "1"  # the old version is untouched
    rundir.publish_dir(out, write({"config.json": "3"}))
    assert sorted(os.listdir(out)) == ["commit_success.txt", "config.json"]  # no file of the old one
    assert sorted(os.listdir(out.parent)) == ["final"]
    assert not rundir.is_published(tmp_path / "hf" / "other")


def test_an_append_log_appends_and_rewrites(tmp_path):
    log = rundir.JsonlLog(tmp_path / "metrics.jsonl")
    log.append({"step": 1})
    log.append({"step": 2})
    log.rewrite([{"step": 1}])
    log.append({"step": 3})
    log.close()
    assert rundir.read_jsonl(tmp_path / "metrics.jsonl") == [{"step": 1}, {"step": 3}]


def test_a_run_is_killed_at_the_named_phase_the_nth_time(monkeypatch):
    code = ("from intraskill_jax import rundir\n"
            "for i in range(3):\n"
            "    rundir.reached('step_rollouts'); rundir.reached('gate_recorded'); print('passed', i, flush=True)\n")
    env = {**os.environ, rundir.KILL_AT_ENV: "gate_recorded:2"}
    killed = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert killed.returncode == -9 and killed.stdout.split("\n")[:-1] == ["passed 0"]
    assert "at phase gate_recorded (time 2)" in killed.stderr
    monkeypatch.delenv(rundir.KILL_AT_ENV, raising=False)
    rundir.reached("gate_recorded")  # without the hook: nothing
    with pytest.raises(ValueError, match="unknown phase"):
        rundir.reached("gate")
    monkeypatch.setenv(rundir.KILL_AT_ENV, "checkpoint:x")
    with pytest.raises(ValueError, match="INTRASKILL_KILL_AT='checkpoint:x'"):
        rundir.reached("checkpoint_commit")
