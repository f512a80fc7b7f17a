"""`intraskill report --workdir W [--out DIR]`: the bundle, its check, the plots and the site.

    <workdir>/bundle/            the shareable bundle (always here; see bundle.py)
    <out>/index.html ...         the static site (default <workdir>/report/)
    <out>/plots/*.svg, *.png     the figures

A run that is still going, was killed, or has no evaluation yet still gets a report of what is
complete; each gap is logged naming its file and listed on the overview page.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import flags
from etils import epath

from sim import flagparse

from intraskill_jax import rundir
from intraskill_jax.analysis.bundle import BundleCheck, build_bundle, check_bundle, load_bundle
from intraskill_jax.analysis.rundata import AnalysisInputError, Problem, load_run
from intraskill_jax.progress import Progress, as_progress

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Report:
    bundle: epath.Path
    out: epath.Path
    index: epath.Path
    plots: dict[str, list[epath.Path]]
    check: BundleCheck
    problems: tuple[Problem, ...]
    figures: dict[str, Any]  # the bundle's figures.json


def build_report(
    workdir: rundir.PathLike, out: rundir.PathLike | None = None, *, progress: bool | Progress = True
) -> Report:
    """Builds bundle, plots and site for a run directory.

    Raises:
      RunDataError: `workdir` is not a run directory or holds no records at all.
      BundleError: the freshly built bundle fails its own check (a bug, reported with the file).
    """
    # Imported here: matplotlib is only needed once a report is actually drawn.
    from intraskill_jax.analysis import plots as plots_mod
    from intraskill_jax.analysis.site import build_site

    workdir = rundir.run_path(workdir)
    out_dir = rundir.run_path(out) if out is not None else rundir.report_dir(workdir)
    stages = ("read run", "bundle", "check bundle", "plots", "site")
    with as_progress(progress).stage("report", len(stages), unit="stage") as bar:
        bar.update(0, doing=stages[0])
        run = load_run(workdir)
        bar.update(doing=stages[1])
        bundle_dir = build_bundle(workdir, run=run)
        bar.update(doing=stages[2])
        check = check_bundle(bundle_dir)
        bar.update(doing=stages[3])
        plot_dir = out_dir / "plots"
        if plot_dir.is_dir():  # a plot that no longer has data must not survive from a rebuild
            for old in sorted([*plot_dir.glob("*.svg"), *plot_dir.glob("*.png")]):
                rundir.remove(old)
        figures = load_bundle(bundle_dir, verify=False).figures
        written = plots_mod.write_plots(figures, plot_dir)
        bar.update(doing=stages[4])
        index = build_site(bundle_dir, out_dir)
        bar.update(doing="done")
    return Report(bundle_dir, out_dir, index, written, check, tuple(run.problems), figures)


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "the run directory (local or gs://)", required=True, flag_values=values)
    flags.DEFINE_string("out", None, "site directory (default: <workdir>/report)", flag_values=values)
    flags.DEFINE_bool("quiet", False, "no progress bar", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    prog = "intraskill report"
    args = flagparse.parse(prog, __doc__, _define_flags, argv)
    try:
        workdir = rundir.run_path(args.workdir)
        out = None if args.out is None else rundir.run_path(args.out)
    except (ValueError, ImportError) as e:
        flagparse.usage_error(prog, str(e))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        report = build_report(workdir, out, progress=not args.quiet)
    except AnalysisInputError as e:
        log.error("%s", e)
        raise SystemExit(1) from None
    print_report(report, workdir)


def print_report(report: Report, workdir: str | os.PathLike) -> None:
    """Where the report went (and any problems found in the run directory)."""
    if report.problems:
        log.warning(
            "%d problem(s) in %s; the report shows what is complete (listed on its overview page)",
            len(report.problems),
            workdir,
        )
    print(f"bundle: {report.bundle} ({report.check.files} files, verified)")
    print(f"plots:  {report.out / 'plots'} ({len(report.plots)} figures, SVG and PNG)")
    # A local site opens from file://; one on gs:// is named by its URL.
    index = report.index if rundir.is_remote(report.index) else Path(report.index).resolve().as_uri()
    print(f"report: {index}")


if __name__ == "__main__":
    main()
