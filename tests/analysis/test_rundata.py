"""rundata.load_run: complete records are kept, every gap or damage is a problem naming its file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from intraskill_jax import rundir
from intraskill_jax.analysis.rundata import RunDataError, load_run


@pytest.fixture
def damaged(partial_run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(partial_run_dir, tmp_path / "run"))


def _steps_after_last_gate(run: Path) -> tuple[list[int], int]:
    """The metric steps logged after the last gate document, and the number of gates."""
    gates = [rundir.read_json(p) for p in sorted((run / "gates").glob("round_[0-9]*.json"))]
    last = max(g["step"] for g in gates)
    return sorted({r["step"] for r in rundir.read_jsonl(run / "metrics.jsonl")} - set(range(last + 1))), len(gates)


def _paths(run) -> dict[str, str]:
    return {p.path: p.message for p in run.problems}


def test_finished_run_has_no_problems(tiny, run_dir: Path) -> None:
    run = load_run(run_dir, strict=True)
    t = tiny.config.train
    assert len(run.gates) == t.rounds and len(run.skills) == t.rounds + 1
    assert len(run.outcomes) == len(rundir.read_jsonl(rundir.eval_outcomes_path(run_dir))) == 4 * tiny.config.eval.num_tasks
    assert {r["step"] for r in run.rollouts} == set(range(t.steps))
    assert all(c["zh"] and c["en"] for s in run.skills for c in s["chunks"])


def test_run_stopped_mid_round_is_noted(partial_run_dir: Path) -> None:
    tail, gates = _steps_after_last_gate(partial_run_dir)
    assert tail and gates == 1
    run = load_run(partial_run_dir)
    assert run.outcomes == [] and len(run.gates) == gates
    (p,) = run.problems
    assert p.path == "metrics.jsonl" and p.kind == "incomplete"
    assert f"steps {tail[0]}-{tail[-1]}" in p.message and f"round {gates} has not closed" in p.message
    with pytest.raises(RunDataError, match=f"round {gates} has not closed") as e:
        load_run(partial_run_dir, strict=True)
    assert e.value.path == "metrics.jsonl"


def test_missing_step_files_are_named(damaged: Path) -> None:
    files = sorted(p.name for p in (damaged / "rollouts").glob("step_*.jsonl"))
    assert len(files) >= 3
    gap, last = files[1], files[-1]  # the last one: only metrics show it ran
    for name in (gap, last):
        (damaged / "rollouts" / name).unlink()
    problems = _paths(load_run(damaged))
    assert "absent" in problems[f"rollouts/{gap}"] and "absent" in problems[f"rollouts/{last}"]
    assert len(problems) == 3  # and the unfinished round; no step is reported that did exist


def test_torn_and_corrupt_lines_keep_the_rest(damaged: Path) -> None:
    path = damaged / "rollouts" / "step_000002.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:-1]) + lines[-1][:30])  # killed mid-write
    gate_eps = damaged / "gates" / "round_0_episodes.jsonl"
    eps = gate_eps.read_text().splitlines(keepends=True)
    gate_eps.write_text(eps[0] + "{not json\n" + "".join(eps[1:]))
    run = load_run(damaged)
    problems = {p.path: p for p in run.problems}
    assert problems["rollouts/step_000002.jsonl"].kind == "incomplete"
    assert f"line {len(lines)} is a torn last line" in problems["rollouts/step_000002.jsonl"].message
    assert sum(r["step"] == 2 for r in run.rollouts) == len(lines) - 1
    assert problems["gates/round_0_episodes.jsonl"].kind == "corrupt"
    assert sum(e["round"] == 0 for e in run.gate_episodes) == len(eps)  # the inserted line only


def test_broken_gate_and_unwritten_bank(tiny, run_dir: Path, tmp_path: Path) -> None:
    damaged = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("checkpoints", "hf")))
    k = tiny.config.train.rounds - 1  # the last gate, after at least one good one
    assert k >= 1
    (damaged / "gates" / f"round_{k}.json").write_text(f'{{"round": {k}, "step"')
    (damaged / "gates" / "round_0_episodes.jsonl").unlink()
    shutil.rmtree(damaged / "skills" / f"round_{k + 1}")
    run = load_run(damaged)
    problems = _paths(run)
    assert "not JSON" in problems[f"gates/round_{k}.json"]
    assert "validation episodes are absent" in problems["gates/round_0_episodes.jsonl"]
    # With gate k unreadable nothing says round k+1 should exist: no problem is invented for it.
    assert f"skills/round_{k + 1}" not in problems
    assert [g["round"] for g in run.gates] == list(range(k))
    assert [s["round"] for s in run.skills] == list(range(k + 1))


def test_bank_missing_after_its_gate(damaged: Path) -> None:
    shutil.rmtree(damaged / "skills" / "round_1")
    problems = _paths(load_run(damaged))
    assert "round 1: the bank was never written" in problems["skills/round_1"]


def test_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(RunDataError, match="no run directory"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(RunDataError, match="holds no run records"):
        load_run(tmp_path)


def test_repeated_outcomes_keep_the_first(run_dir: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(run_dir, tmp_path / "run",
                               ignore=shutil.ignore_patterns("bundle", "report", "checkpoints", "hf")))
    path = run / "eval" / "outcomes.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[0] + lines[5])
    loaded = load_run(run)
    assert len(loaded.outcomes) == len(lines)
    assert "2 repeated (condition, task)" in _paths(loaded)["eval/outcomes.jsonl"]
