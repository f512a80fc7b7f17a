"""The bundle: round trip, SHA-256 manifest, recomputed figures, and clear errors on damage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from intraskill_jax import rundir
from intraskill_jax.analysis import bundle, results
from intraskill_jax.analysis.bundle import BundleError, build_bundle, check_bundle
from intraskill_jax.skills.bank import SkillBank

PRIMARY = ("config.json", "problems.json", "metrics.jsonl", "groups.jsonl", "gates.json", "validation_episodes.jsonl",
           "outcomes.jsonl", "traces.jsonl", "provenance.json")
DERIVED = ("contributions.jsonl", "paired_outcomes.jsonl", "figures.json")


def test_round_trip(tiny, run_dir: Path, bundle_dir: Path) -> None:
    t = tiny.config.train
    assert bundle_dir == run_dir / "bundle"
    check = check_bundle(bundle_dir)
    skills = [f"skills/round_{k}.json" for k in range(t.rounds + 1)]
    assert bundle.bundle_files(bundle_dir) == sorted([*PRIMARY, *DERIVED, *skills])
    assert check.files == len(skills) + len(PRIMARY) + len(DERIVED) and check.values > 1000
    data = bundle.load_bundle(bundle_dir)
    assert data.outcomes == rundir.read_jsonl(rundir.eval_outcomes_path(run_dir))
    assert data.config == json.loads((run_dir / "config.json").read_text())
    banks = [SkillBank.load_round(run_dir, k) for k in range(t.rounds + 1)]
    assert [s["name"] for s in data.skills] == [b.name for b in banks]
    assert [[c["zh"] for c in s["chunks"]] for s in data.skills] == [[c.zh for c in b.chunks] for b in banks]
    assert data.problems == []
    figures = json.loads((bundle_dir / "figures.json").read_text())
    assert figures == data.figures
    assert figures["conditions"] == results.condition_table(data.outcomes)
    assert figures["run"]["rounds_closed"] == t.rounds and figures["run"]["last_step"] == t.steps
    manifest = json.loads((bundle_dir / "manifest.json").read_text())
    assert sorted(manifest["files"]) == bundle.bundle_files(bundle_dir)


def test_traces_and_provenance(tiny, run_dir: Path, bundle_dir: Path) -> None:
    """The bundle carries the evaluation's traces and the run's provenance as the run wrote them,
    and the policy's parameter count read from its safetensors headers."""
    data = bundle.load_bundle(bundle_dir)
    assert data.traces == rundir.read_jsonl(rundir.eval_traces_path(run_dir)) and data.traces
    rows = rundir.read_jsonl(rundir.provenance_path(run_dir))
    assert data.provenance["sessions"] == [r for r in rows if r["kind"] == "session"]
    assert [s["command"] for s in data.provenance["sessions"]] == ["train", "eval"]
    stages = [r["stage"] for r in data.provenance["stages"]]
    t = tiny.config.train
    assert stages.count("training") == stages.count("gate") == t.rounds and stages.count("evaluation") == 4
    model = data.provenance["model"]
    assert model["which"] == "trained policy" and model["config"]["model_type"]
    from safetensors.numpy import load_file

    weights = load_file(str(rundir.final_policy_dir(run_dir) / "model.safetensors"))
    assert model["parameters"] == sum(w.size for w in weights.values()) > 0
    f = data.figures
    assert f["run"]["parameters"] == model["parameters"] and f["run"]["training_runs"] == 1
    assert f["protocol"]["splits"]["test"] == tiny.config.sim.splits.num_test
    assert [r["stage"] for r in f["protocol"]["stage_totals"]][-1] == "total"
    assert f["controls"] == [{"id": c, "this_run": False} for c in ("plain_grpo", "fixed_skill", "no_mask", "seeds")]
    for trace in data.traces:  # a trace's turns account for every token of its episode
        total = trace["prompt_tokens"] + sum(len(u["reply_token_ids"]) + u["observation_tokens"] for u in trace["transcript"])
        assert sum(len(u["reply_token_ids"]) for u in trace["transcript"]) == trace["generated_tokens"]
        assert total >= trace["prompt_tokens"] + trace["generated_tokens"]
        assert trace["task"]["instruction"] in trace["prompt"]


def test_edited_trace_is_caught(bundle_copy: Path) -> None:
    """A trace edited and re-hashed no longer matches the figures derived from it."""
    path = bundle_copy / "traces.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["reward"] = 0.123
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    bundle.write_manifest(bundle_copy)
    _expect(bundle_copy, "figures.json", "mismatch", "/traces/0/reward")


def _expect(bundle_dir: Path, path: str, kind: str, text: str) -> BundleError:
    with pytest.raises(BundleError) as e:
        check_bundle(bundle_dir)
    named: dict[str, object] = {}
    for p in e.value.problems:
        named.setdefault(p.path, p)  # the first problem of a file is its most specific
    assert path in named, e.value
    assert named[path].kind == kind and text in named[path].message, named[path]
    assert path in str(e.value)
    return e.value


def test_tampered_file(bundle_copy: Path) -> None:
    path = bundle_copy / "outcomes.jsonl"
    text = path.read_text()
    path.write_text(text.replace('"success": false', '"success": true ', 1))  # same length
    _expect(bundle_copy, "outcomes.jsonl", "mismatch", "SHA-256 differs")


def test_deleted_file(bundle_copy: Path) -> None:
    (bundle_copy / "skills" / "round_1.json").unlink()
    _expect(bundle_copy, "skills/round_1.json", "missing", "deleted")


def test_truncated_jsonl(bundle_copy: Path) -> None:
    path = bundle_copy / "groups.jsonl"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 40])
    err = _expect(bundle_copy, "groups.jsonl", "incomplete", "truncated")
    assert "last line is cut off" in str(err)


def test_added_file_and_missing_manifest(bundle_copy: Path) -> None:
    (bundle_copy / "extra.json").write_text("{}")
    _expect(bundle_copy, "extra.json", "mismatch", "not in the manifest")
    (bundle_copy / "manifest.json").unlink()
    _expect(bundle_copy, "manifest.json", "missing", "absent")


def test_data_changed_with_manifest_rewritten_is_caught_by_recomputation(bundle_copy: Path) -> None:
    # Someone edits an outcome and re-hashes: the hashes pass, the figures no longer follow.
    path = bundle_copy / "outcomes.jsonl"
    rows = rundir.read_jsonl(path)
    flip = next(i for i, r in enumerate(rows) if r["condition"] == "trained_skill" and not r["success"])
    rows[flip]["success"] = True
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    bundle.write_manifest(bundle_copy)
    err = _expect(bundle_copy, "figures.json", "mismatch", "recomputed from the bundle")
    task_index = sorted({r["task_id"] for r in rows}).index(rows[flip]["task_id"])
    assert any(
        p.path == "paired_outcomes.jsonl"
        and p.message.startswith(f"/{task_index}/success~1trained_skill: False in the file, True")
        for p in err.problems
    )


def test_figure_edited_with_manifest_rewritten(bundle_copy: Path) -> None:
    path = bundle_copy / "figures.json"
    figures = json.loads(path.read_text())
    figures["comparisons"][0]["success_ci_low"] += 0.01
    path.write_text(json.dumps(figures))
    bundle.write_manifest(bundle_copy)
    _expect(bundle_copy, "figures.json", "mismatch", "/comparisons/0/success_ci_low")


def test_rebuild_replaces_the_old_bundle(run_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "b"
    build_bundle(run_dir, out)
    (out / "stale.txt").write_text("old")
    build_bundle(run_dir, out)
    assert not (out / "stale.txt").exists()
    check_bundle(out)
    assert not list(tmp_path.glob(".b.*"))


def test_partial_run_bundles_what_is_complete(partial_run_dir: Path, tmp_path: Path) -> None:
    out = build_bundle(partial_run_dir, tmp_path / "bundle")
    check_bundle(out)
    figures = json.loads((out / "figures.json").read_text())
    assert figures["conditions"] == [] and figures["comparisons"] == []
    last_step = max(r["step"] for r in rundir.read_jsonl(partial_run_dir / "metrics.jsonl"))
    assert figures["run"]["last_step"] == last_step and figures["run"]["problems"] == 1
    (problem,) = json.loads((out / "problems.json").read_text())
    assert problem["path"] == "metrics.jsonl" and "has not closed" in problem["message"]


def test_check_needs_no_jax_and_cli(bundle_dir: Path, bundle_copy: Path, capsys: pytest.CaptureFixture) -> None:
    code = (
        "import sys; from intraskill_jax.analysis.bundle import check_bundle; "
        f"check_bundle({str(bundle_dir)!r}); "
        "heavy = [m for m in ('jax', 'flax', 'torch', 'transformers') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[2])
    bundle.main([str(bundle_dir)])
    assert "check-bundle: OK" in capsys.readouterr().out
    (bundle_copy / "gates.json").unlink()
    with pytest.raises(SystemExit) as e:
        bundle.main([str(bundle_copy)])
    assert e.value.code == 1
    assert "gates.json: listed in the manifest but absent" in capsys.readouterr().err


def test_records_in_an_unreadable_shape(bundle_copy: Path) -> None:
    path = bundle_copy / "outcomes.jsonl"
    rows = rundir.read_jsonl(path)
    del rows[0]["task_id"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    bundle.write_manifest(bundle_copy)
    with pytest.raises(BundleError, match="recomputing the derived files failed: KeyError"):
        check_bundle(bundle_copy)


def test_cli_accepts_the_run_directory(run_dir: Path, bundle_dir: Path, capsys: pytest.CaptureFixture) -> None:
    bundle.main([str(run_dir)])
    assert f"check-bundle: OK: {bundle_dir}" in capsys.readouterr().out
