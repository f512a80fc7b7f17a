"""rundata.load_run: complete records are kept, every gap or damage is a problem naming its file."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from intraskill_jax.analysis.rundata import RunDataError, load_run


@pytest.fixture
def damaged(partial_run_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(partial_run_dir, tmp_path / "run"))


def _paths(run) -> dict[str, str]:
    return {p.path: p.message for p in run.problems}


def test_finished_run_has_no_problems(run_dir: Path) -> None:
    run = load_run(run_dir, strict=True)
    assert len(run.gates) == 2 and len(run.skills) == 3 and len(run.outcomes) == 160
    assert {r["step"] for r in run.rollouts} == set(range(10))
    assert run.skills[2]["chunks"][0]["zh"]


def test_run_stopped_mid_round_is_noted(partial_run_dir: Path) -> None:
    run = load_run(partial_run_dir)
    assert run.outcomes == []
    (p,) = run.problems
    assert p.path == "metrics.jsonl" and p.kind == "incomplete"
    assert "steps 11-13" in p.message and "round 2 has not closed" in p.message
    with pytest.raises(RunDataError, match="round 2 has not closed") as e:
        load_run(partial_run_dir, strict=True)
    assert e.value.path == "metrics.jsonl"


def test_missing_step_files_are_named(damaged: Path) -> None:
    (damaged / "rollouts" / "step_000004.jsonl").unlink()
    (damaged / "rollouts" / "step_000012.jsonl").unlink()  # the last one: only metrics show it ran
    problems = _paths(load_run(damaged))
    assert "absent" in problems["rollouts/step_000004.jsonl"]
    assert "absent" in problems["rollouts/step_000012.jsonl"]
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


def test_broken_gate_and_unwritten_bank(damaged: Path) -> None:
    (damaged / "gates" / "round_1.json").write_text('{"round": 1, "step"')
    (damaged / "gates" / "round_0_episodes.jsonl").unlink()
    shutil.rmtree(damaged / "skills" / "round_2")
    run = load_run(damaged)
    problems = _paths(run)
    assert "not JSON" in problems["gates/round_1.json"]
    assert "validation episodes are absent" in problems["gates/round_0_episodes.jsonl"]
    # With gate 1 unreadable nothing says round 2 should exist: no problem is invented for it.
    assert "skills/round_2" not in problems
    assert [g["round"] for g in run.gates] == [0]
    assert [s["round"] for s in run.skills] == [0, 1]


def test_bank_missing_after_its_gate(damaged: Path) -> None:
    shutil.rmtree(damaged / "skills" / "round_2")
    problems = _paths(load_run(damaged))
    assert "round 2: the bank was never written" in problems["skills/round_2"]


def test_not_a_run(tmp_path: Path) -> None:
    with pytest.raises(RunDataError, match="no run directory"):
        load_run(tmp_path / "nowhere")
    with pytest.raises(RunDataError, match="holds no run records"):
        load_run(tmp_path)


def test_repeated_outcomes_keep_the_first(run_dir: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("bundle", "report")))
    path = run / "eval" / "outcomes.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines) + lines[0] + lines[5])
    loaded = load_run(run)
    assert len(loaded.outcomes) == 160
    assert "2 repeated (condition, task)" in _paths(loaded)["eval/outcomes.jsonl"]
