"""The config files the end-to-end tests run, and the killed-and-resumed run they share, so no test
module imports another."""

import dataclasses
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
# What every end-to-end smoke run adds, the reference and the killed runs alike: the warm start
# takes one update per demonstration (two of the smoke run's 16 oracle episodes finish in its four
# turns), each checkpointed, so a kill between them resumes it midway.
OVERRIDES = {"warm_start.sft.checkpoint_every": 1, "warm_start.sft.batch_size": 1}


@dataclasses.dataclass(frozen=True)
class Kill:
    """A SIGKILL of `intraskill <command>` the n-th time its process reaches `phase`
    (`rundir.reached`); `leaves` names what the kill must have left (`_assert_killed_at`)."""

    command: str
    phase: str
    n: int
    leaves: str


# A run from nothing to its report, killed once in each stage, each kill in a new process that
# resumes what the last one left (the smoke config: two rounds of two steps, checkpoints at every
# step; step s below is the learner's step count, step index s - 1 its s-th step):
KILLS = (
    Kill("train", "dir_written", 1, "base uncommitted"),  # the fresh policy written, not committed
    Kill("train", "checkpoint_commit", 2, "sft midway"),  # SFT update 1 committed, update 2 mid-commit
    Kill("train", "step_rollouts", 2, "step 1 rollouts"),  # step index 1's episodes, not trained on
    Kill("train", "checkpoint_commit", 1, "step 2 uncommitted"),  # step 2's checkpoint mid-commit
    Kill("train", "gate_recorded", 1, "gate 0 recorded"),  # round 0's gate record, not its bank
    Kill("train", "bank_committed", 1, "bank 1 committed"),  # the bank, before any later metric
    Kill("train", "step_rollouts", 2, "step 3 rollouts"),  # round 1's second step (index 3)
    Kill("train", "dir_written", 1, "final uncommitted"),  # hf/final written, not committed
    Kill("eval", "eval_recorded", 1, "outcomes without traces"),
    Kill("report", "dir_written", 1, "bundle uncommitted"),  # every file but the manifest
)
# The bundle's files whose bytes a resumed run must reproduce: all but those holding wall times
# (perf/ metrics, provenance's stage times, and figures.json, which summarises both).
TIMED_BUNDLE_FILES = ("manifest.json", "metrics.jsonl", "provenance.json", "figures.json")


def smoke_config():
    from intraskill_jax import runconfig

    return runconfig.with_overrides(runconfig.load_file(SMOKE), OVERRIDES)


def finish(config, workdir) -> None:
    """Evaluates `workdir` and builds its report, in this process, unless already done."""
    from intraskill_jax import rundir
    from intraskill_jax.analysis.bundle import MANIFEST
    from intraskill_jax.analysis.report import build_report
    from intraskill_jax.evaluate import evaluate

    if not rundir.eval_traces_path(workdir).is_file():
        evaluate(config, workdir, progress=False)
    if not rundir.is_published(rundir.bundle_dir(workdir), commit_file=MANIFEST):
        build_report(workdir, progress=False)


def command(name: str, workdir: str, *, env: dict[str, str], cwd: Path = REPO, kill_at: str | None = None,
            timeout: float = 900) -> subprocess.CompletedProcess:
    """`intraskill <name>` (train, eval or report) of the smoke config in a subprocess, from this
    checkout (whatever `cwd`)."""
    from intraskill_jax import rundir

    env = {**os.environ, **env, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    env.pop(rundir.KILL_AT_ENV, None)
    if kill_at is not None:
        env[rundir.KILL_AT_ENV] = kill_at
    args = [f"--workdir={workdir}", "--quiet"]
    if name != "report":
        args += [f"--config={SMOKE}", *(f"--config.{k}={v}" for k, v in OVERRIDES.items())]
    return subprocess.run([sys.executable, "-m", "intraskill_jax.cli", name, *args], cwd=cwd, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=timeout)


def run_through_kills(workdir: str, *, env: dict[str, str], cwd: Path = REPO) -> None:
    """Trains, evaluates and reports `workdir` from nothing, killed at each of `KILLS` on the way
    (each kill checked to have happened where it says, from what it left in the run directory)."""
    for name in ("train", "eval", "report"):  # each command's kills, then the command to its end
        for kill in (k for k in KILLS if k.command == name):
            killed = command(name, workdir, env=env, cwd=cwd, kill_at=f"{kill.phase}:{kill.n}")
            assert killed.returncode == -signal.SIGKILL, f"{kill}: exit {killed.returncode}\n{killed.stderr[-3000:]}"
            assert f"at phase {kill.phase}" in killed.stderr
            _assert_killed_at(kill.leaves, workdir)
        done = command(name, workdir, env=env, cwd=cwd)
        assert done.returncode == 0, done.stderr[-3000:]


def _assert_killed_at(leaves: str, workdir: str) -> None:
    from intraskill_jax import rundir
    from intraskill_jax.analysis.bundle import MANIFEST
    from intraskill_jax.metrics import read_metrics

    remote = rundir.is_remote(workdir)

    def uncommitted(path) -> None:
        """Written but not committed: on an object store its files without the commit file, locally
        the temporary directory never renamed into place."""
        commit = MANIFEST if path.name == "bundle" else rundir.COMMIT_MARKER
        assert not rundir.is_published(path, commit_file=commit), path
        if remote:
            assert rundir.list_files(path) and commit not in rundir.list_files(path), path
        else:
            assert Path(f"{path}.tmp").is_dir(), path

    def checkpoints(directory):
        # Listed, not opened: a Checkpointer would clean the unfinished step up.
        return {p.name: p for p in rundir.checkpoints_dir(directory).iterdir()}

    def committed(entries, step) -> bool:
        if remote:  # orbax on GCS writes into the step's prefix, its commit file last
            return str(step) in entries and (entries[str(step)] / "commit_success.txt").exists()
        return str(step) in entries  # locally the temporary directory is renamed into place

    def last_logged() -> int:
        return max(r["step"] for r in read_metrics(workdir))

    if leaves == "base uncommitted":
        uncommitted(rundir.base_policy_dir(workdir))
        assert not rundir.sft_dir(workdir).exists()
    elif leaves == "sft midway":
        entries = checkpoints(rundir.sft_dir(workdir))
        assert committed(entries, 1) and not committed(entries, 2), sorted(entries)
        assert not rundir.is_published(rundir.sft_policy_dir(workdir))
    elif leaves == "step 1 rollouts":
        assert rundir.rollouts_path(workdir, 1).is_file() and last_logged() == 1
    elif leaves == "step 2 uncommitted":
        entries = checkpoints(workdir)
        assert committed(entries, 1) and not committed(entries, 2), sorted(entries)
    elif leaves == "gate 0 recorded":
        assert rundir.gate_path(workdir, 0).is_file() and rundir.latest_round(workdir) == 0
    elif leaves == "bank 1 committed":
        assert rundir.latest_round(workdir) == 1 and last_logged() == 2
    elif leaves == "step 3 rollouts":
        assert rundir.rollouts_path(workdir, 3).is_file() and last_logged() == 3 and rundir.latest_round(workdir) == 1
    elif leaves == "final uncommitted":
        assert rundir.latest_round(workdir) == 2 and not rundir.final_record_path(workdir).exists()
        uncommitted(rundir.final_policy_dir(workdir))
    elif leaves == "outcomes without traces":
        assert rundir.eval_outcomes_path(workdir).is_file() and not rundir.eval_traces_path(workdir).exists()
    elif leaves == "bundle uncommitted":
        uncommitted(rundir.bundle_dir(workdir))
    else:
        raise ValueError(f"unknown kill state {leaves!r}")


def assert_same_run(reference, other, config) -> None:
    """`other` ended as the uninterrupted `reference`: the same `hf/final` (byte for byte), warm
    start, bank decisions and banks, training episodes and metrics, evaluation records, and the
    bundle's files (by their manifest hashes) but those holding wall times."""
    from intraskill_jax import rundir
    from intraskill_jax.metrics import read_metrics
    from intraskill_jax.skills.bank import SkillBank

    for directory in (rundir.final_policy_dir, rundir.sft_policy_dir):
        a, b = directory(reference), directory(other)
        files = rundir.list_files(a)
        assert "model.safetensors" in files and rundir.list_files(b) == files
        for rel in files:
            assert (a / rel).read_bytes() == (b / rel).read_bytes(), f"{a.name}/{rel} differs"
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
    for a, b in ((reference, other), (rundir.sft_dir(reference), rundir.sft_dir(other))):
        ra, rb = read_metrics(a), read_metrics(b)
        assert [r["step"] for r in ra] == [r["step"] for r in rb], a
        for x, y in zip(ra, rb):
            assert x.keys() == y.keys()
            for key in x:
                if key.startswith(("train/", "rollout/", "gate/", "skills/", "eval/")):
                    assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), (x["step"], key)
    for path in (rundir.eval_outcomes_path, rundir.eval_traces_path):
        assert rundir.read_jsonl(path(other)) == rundir.read_jsonl(path(reference)), path(other).name
    hashes = [rundir.read_json(rundir.bundle_dir(run) / "manifest.json")["files"] for run in (reference, other)]
    assert hashes[0].keys() == hashes[1].keys()
    for name in hashes[0]:
        if name not in TIMED_BUNDLE_FILES:
            assert hashes[1][name] == hashes[0][name], f"bundle/{name} differs"
