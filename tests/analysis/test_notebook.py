"""notebooks/analysis.ipynb runs against a bundle and reproduces the report's headline tables.

Its code cells are executed in order in one namespace, as a kernel would, with the bundle path
given through INTRASKILL_BUNDLE (the first code cell reads it); no Jupyter server is needed.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).resolve().parents[2] / "notebooks" / "analysis.ipynb"


def _code_cells() -> list[str]:
    nb = json.loads(NOTEBOOK.read_text(encoding="utf-8"))
    assert nb["nbformat"] == 4
    cells = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c["outputs"] for c in cells), "commit the notebook without outputs"
    return ["".join(c["source"]) for c in cells]


def _run(bundle: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("INTRASKILL_BUNDLE", str(bundle))
    cells = _code_cells()
    assert "BUNDLE =" in cells[0], "the first code cell sets the bundle path"
    namespace: dict = {"__name__": "__main__"}
    for i, source in enumerate(cells):
        exec(compile(source, f"{NOTEBOOK.name}[code cell {i}]", "exec"), namespace)
    return namespace


def test_notebook_reproduces_headline_tables(bundle_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture) -> None:
    ns = _run(bundle_dir, monkeypatch)
    figures = json.loads((bundle_dir / "figures.json").read_text(encoding="utf-8"))
    assert ns["table"] == figures["conditions"] and len(ns["table"]) == 4
    assert ns["comparisons"] == figures["comparisons"]
    assert ns["contributions"] == figures["contributions"]
    out = capsys.readouterr().out
    assert "the headline tables match figures.json" in out and "trained_skill vs base_skill" in out


def test_notebook_on_a_bundle_without_evaluation(partial_run_dir: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture) -> None:
    from intraskill_jax.analysis.bundle import build_bundle

    ns = _run(build_bundle(partial_run_dir, tmp_path / "bundle"), monkeypatch)
    assert ns["table"] == [] and ns["comparisons"] == []
    out = capsys.readouterr().out
    assert "no evaluation in this bundle yet" in out and "problem in the run: metrics.jsonl" in out
