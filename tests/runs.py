"""The config files the end-to-end tests run, and the killed-and-resumed training they share, so
no test module imports another."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart.py"
SMOKE = f"{QUICKSTART}:smoke"  # the quickstart shrunk to minutes on two cores (configs/quickstart.py)

# Where a smoke run is killed (`rundir.reached`), in order, each the n-th time its process gets
# there: from a run whose policy and warm start are done, step 1's episodes (step 0 checkpointed,
# step 1 not updated); step 2's checkpoint mid-commit (resumes at 1); round 0's gate record before
# its bank (resumes at 2 and redoes the gate); right after that bank, before any later metric.
KILLS = (("step_rollouts", 2), ("checkpoint_commit", 1), ("gate_recorded", 1), ("bank_committed", 1))


def smoke_config():
    from intraskill_jax import runconfig

    return runconfig.load_file(SMOKE)


def train(workdir: str, *, env: dict[str, str], cwd: Path = REPO, kill_at: str | None = None,
          timeout: float = 900) -> subprocess.CompletedProcess:
    """`intraskill train` of the smoke config in a subprocess, from this checkout (whatever `cwd`)."""
    from intraskill_jax import rundir

    env = {**os.environ, **env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop(rundir.KILL_AT_ENV, None)
    if kill_at is not None:
        env[rundir.KILL_AT_ENV] = kill_at
    command = [sys.executable, "-m", "intraskill_jax.cli", "train", f"--config={SMOKE}", f"--workdir={workdir}",
               "--quiet"]
    return subprocess.run(command, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=timeout)


def train_through_kills(workdir: str, *, env: dict[str, str], cwd: Path = REPO) -> None:
    """Trains `workdir` to the end, killed at each of `KILLS` on the way (each kill checked to have
    happened at its phase, from what it left in the run directory)."""
    for phase, n in KILLS:
        killed = train(workdir, env=env, cwd=cwd, kill_at=f"{phase}:{n}")
        assert killed.returncode == -signal.SIGKILL, f"{phase}: exit {killed.returncode}\n{killed.stderr[-3000:]}"
        assert f"at phase {phase}" in killed.stderr
        _assert_killed_at(phase, workdir)
    done = train(workdir, env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr[-3000:]


def _assert_killed_at(phase: str, workdir: str) -> None:
    from intraskill_jax import rundir
    from intraskill_jax.metrics import read_metrics

    last_logged = max(r["step"] for r in read_metrics(workdir))
    if phase == "step_rollouts":
        assert rundir.rollouts_path(workdir, 1).is_file() and last_logged == 1
    elif phase == "checkpoint_commit":
        # Listed, not opened: a Checkpointer would clean the unfinished step up.
        entries = {p.name: p for p in rundir.checkpoints_dir(workdir).iterdir()}
        if rundir.is_remote(workdir):  # orbax on GCS writes into the step's prefix, its commit file last
            assert "2" not in entries or not (entries["2"] / "commit_success.txt").exists(), sorted(entries)
        else:  # locally: the temporary directory, never renamed into place
            assert "2" not in entries and any(n.startswith("2.orbax-checkpoint-tmp") for n in entries), sorted(entries)
    elif phase == "gate_recorded":
        assert rundir.gate_path(workdir, 0).is_file() and rundir.latest_round(workdir) == 0
    elif phase == "bank_committed":
        assert rundir.latest_round(workdir) == 1 and last_logged == 2


def assert_same_run(reference, other, config) -> None:
    """`other` ended as the uninterrupted `reference`: the same `hf/final` (byte for byte), bank
    decisions and banks, training episodes and metrics."""
    from intraskill_jax import rundir
    from intraskill_jax.metrics import read_metrics
    from intraskill_jax.skills.bank import SkillBank

    final_a, final_b = rundir.final_policy_dir(reference), rundir.final_policy_dir(other)
    files = rundir.list_files(final_a)
    assert "model.safetensors" in files and rundir.list_files(final_b) == files
    for rel in files:
        assert (final_a / rel).read_bytes() == (final_b / rel).read_bytes(), f"hf/final/{rel} differs"
    assert rundir.read_json(rundir.final_record_path(other)) == rundir.read_json(rundir.final_record_path(reference))
    assert rundir.latest_round(other) == rundir.latest_round(reference) == config.train.rounds
    for r in range(config.train.rounds):
        a, b = rundir.read_json(rundir.gate_path(reference, r)), rundir.read_json(rundir.gate_path(other, r))
        assert [(d["column"], d["action"]) for d in a["decisions"]] == [(d["column"], d["action"]) for d in b["decisions"]]
        np.testing.assert_allclose(a["beta"], b["beta"], atol=1e-6)
        bank_a, bank_b = SkillBank.load_round(reference, r + 1), SkillBank.load_round(other, r + 1)
        assert bank_a.chunks == bank_b.chunks
        assert [(e.chunk_id, e.action) for e in bank_a.ledger] == [(e.chunk_id, e.action) for e in bank_b.ledger]
    for step in range(config.train.steps):
        ea = rundir.read_jsonl(rundir.rollouts_path(reference, step))
        eb = rundir.read_jsonl(rundir.rollouts_path(other, step))
        assert [(e["episode_id"], e["reward"], e["generated_tokens"]) for e in ea] == \
            [(e["episode_id"], e["reward"], e["generated_tokens"]) for e in eb]
    ra, rb = read_metrics(reference), read_metrics(other)
    assert [r["step"] for r in ra] == [r["step"] for r in rb]
    for x, y in zip(ra, rb):
        assert x.keys() == y.keys()
        for key in x:
            if key.startswith(("train/", "rollout/", "gate/", "skills/")):
                assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), (x["step"], key)
