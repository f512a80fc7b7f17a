"""The analysis tests read one real tiny run (tests/analysis/tiny_run.py), built once per session."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from intraskill_jax.analysis.bundle import build_bundle
from tests.analysis import tiny_run


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tiny_run.TinyRun:
    return tiny_run.build(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def run_dir(tiny: tiny_run.TinyRun) -> Path:
    """A finished run: three rounds closed by the gate, evaluated in the four test conditions."""
    return tiny.run


@pytest.fixture(scope="session")
def bundle_dir(run_dir: Path) -> Path:
    return Path(build_bundle(run_dir))


@pytest.fixture
def bundle_copy(bundle_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the bundle for a test that damages it."""
    return Path(shutil.copytree(bundle_dir, tmp_path / "bundle"))


@pytest.fixture(scope="session")
def partial_run_dir(tiny: tiny_run.TinyRun) -> Path:
    """The run as a kill in round 1 left it: gate 0 closed, steps 1-3 logged, no evaluation."""
    return tiny.partial


@pytest.fixture(scope="session")
def fresh_run_dir(tiny: tiny_run.TinyRun) -> Path:
    """The run as a kill after its first step left it: no gate, no evaluation."""
    return tiny.fresh


@pytest.fixture(scope="session")
def report(run_dir: Path, bundle_dir: Path):
    """The full report of the finished run (bundle rebuilt in place, plots, site)."""
    from intraskill_jax.analysis.report import build_report

    return build_report(run_dir, progress=False)


@pytest.fixture(scope="session")
def figures(report) -> dict:
    return json.loads((report.bundle / "figures.json").read_text(encoding="utf-8"))
