"""Synthetic run directories and bundles shared by the analysis tests (built once per session)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from intraskill_jax.analysis.bundle import build_bundle
from tests.analysis.synthetic_run import RunSpec, make_run


@pytest.fixture(scope="session")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished run: two rounds, two gates, three skill rounds, four test conditions."""
    return make_run(tmp_path_factory.mktemp("run") / "run", RunSpec())


@pytest.fixture(scope="session")
def bundle_dir(run_dir: Path) -> Path:
    return build_bundle(run_dir)


@pytest.fixture
def bundle_copy(bundle_dir: Path, tmp_path: Path) -> Path:
    """A private copy of the bundle for a test that damages it."""
    return Path(shutil.copytree(bundle_dir, tmp_path / "bundle"))


@pytest.fixture(scope="session")
def partial_run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run killed mid-round: gates of two rounds, three steps of round 2, no evaluation."""
    return make_run(
        tmp_path_factory.mktemp("partial") / "run", RunSpec(with_eval=False, extra_steps=3)
    )


@pytest.fixture(scope="session")
def report(run_dir: Path, bundle_dir: Path):
    """The full report of the finished run (bundle rebuilt in place, plots, site)."""
    from intraskill_jax.analysis.report import build_report

    return build_report(run_dir, progress=False)


@pytest.fixture(scope="session")
def figures(report) -> dict:
    import json

    return json.loads((report.bundle / "figures.json").read_text(encoding="utf-8"))
