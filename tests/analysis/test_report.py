"""`intraskill report`: the whole pipeline on a finished run and on one stopped mid-round."""

from __future__ import annotations

import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from intraskill_jax.analysis import plots, report as report_mod
from intraskill_jax.analysis.bundle import check_bundle


def test_full_report(report, run_dir: Path) -> None:
    assert report.out == run_dir / "report" and report.index == run_dir / "report" / "index.html"
    assert set(report.plots) == set(plots.PLOTS)
    for svg, png in report.plots.values():
        root = ET.parse(svg).getroot()
        assert root.tag.endswith("svg")
        assert "<dc:date>" not in svg.read_text()  # rebuilds give identical files
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.problems == ()
    check_bundle(report.bundle)


def test_plots_skip_what_has_no_data(figures: dict) -> None:
    empty = {**figures, "conditions": [], "comparisons": [], "funnel": [], "contributions": [],
             "behaviour": {"by_condition": [], "by_checkpoint": []}}
    for name in ("conditions", "flips", "funnel", "contributions", "behaviour", "behaviour_checkpoints"):
        assert plots.PLOTS[name](empty) is None


def test_partial_run_still_reports(partial_run_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = Path(shutil.copytree(partial_run_dir, tmp_path / "run"))
    (run / "rollouts" / "step_000001.jsonl").unlink()  # and a lost step file on top
    report_mod.main(["--workdir", str(run), "--out", str(tmp_path / "site"), "--quiet"])
    out = capsys.readouterr().out
    assert f"report: {(tmp_path / 'site' / 'index.html').as_uri()}" in out
    overview = (tmp_path / "site" / "index.html").read_text(encoding="utf-8")  # the front page lists the gaps
    assert "<code>rollouts/step_000001.jsonl</code> (missing)" in overview
    assert "<code>metrics.jsonl</code> (incomplete)" in overview and "round 1 has not closed" in overview
    assert "No evaluation yet" in (tmp_path / "site" / "results.html").read_text(encoding="utf-8")
    made = {p.stem for p in (tmp_path / "site" / "plots").glob("*.svg")}
    assert made == {"training", "optimisation", "behaviour_checkpoints", "contributions", "funnel"}
    for name in ("index.zh.html", "results.zh.html", "task.html"):  # every page, even without an evaluation
        assert (tmp_path / "site" / name).is_file()
    check_bundle(run / "bundle")


def test_not_a_run_exits_with_the_reason(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(SystemExit) as e:
        report_mod.main(["--workdir", str(tmp_path / "missing"), "--quiet"])
    assert e.value.code == 1
    assert "no run directory" in caplog.text


def _flat_contributions(value: float) -> dict:
    """Two chunks over two gates whose every estimate is `value` up to float noise."""
    rows = [{"round": r, "chunk": c, "kind": "chunk", "beta": value + 1e-17 * r, "ci_low": value - 2e-17,
             "ci_high": value + 3e-17} for r in (0, 1) for c in ("query-specific", "when-to-buy")]
    return {"contributions": rows, "run": {"reward": "loose"}}


@pytest.mark.parametrize("value", [0.0, 0.25])
def test_flat_values_keep_a_readable_axis(value: float) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    figure = plots.plot_contributions(_flat_contributions(value))
    FigureCanvasAgg(figure).draw()
    for ax in (a for a in figure.axes if a.get_visible()):
        low, high = ax.get_ylim()
        assert high - low >= 0.1 and low <= value <= high
        assert ax.yaxis.get_offset_text().get_text() == ""  # no "1e-17" above the axis
    assert "loose" in figure.get_supylabel()


def test_flat_counts_and_rates_start_at_zero() -> None:
    from matplotlib.figure import Figure

    ax = Figure().subplots()
    plots.keep_readable_scale(ax, [0.0, 1e-18, None], floor=0.0)
    assert ax.get_ylim() == (0.0, 1.0)
    plots.keep_readable_scale(ax, [0.5, 0.5], rate=True)
    assert ax.get_ylim() == (0.0, 1.0)
    ax.set_ylim(-3, 7)
    plots.keep_readable_scale(ax, [0.0, 0.5])  # a real spread keeps matplotlib's own scale
    assert ax.get_ylim() == (-3.0, 7.0)


def test_flat_training_curves_keep_a_readable_axis(figures: dict) -> None:
    """A run whose every metric stayed at one value (nothing admitted, nothing learned) still draws
    axes a reader can read: a real range around the value, no 1e-17 offset, every panel labelled."""
    import copy

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    flat = copy.deepcopy(figures)
    for name, s in flat["training"]["series"].items():
        value = 1.0 if name.endswith("truncation_rate") else 0.0
        s["raw"] = [value + 1e-17 * i for i in range(len(s["raw"]))]
        s["mean"] = list(s["raw"])
    for plot in (plots.plot_training, plots.plot_optimisation):
        figure = plot(flat)
        FigureCanvasAgg(figure).draw()
        for ax in (a for a in figure.axes if a.get_visible()):
            low, high = ax.get_ylim()
            assert high - low >= 0.5, (plot.__name__, ax.get_title(), low, high)
            assert ax.yaxis.get_offset_text().get_text() == ""
            assert ax.get_xlabel() and ax.get_ylabel(), (plot.__name__, ax.get_title())
