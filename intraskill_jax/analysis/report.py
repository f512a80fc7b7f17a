"""`intraskill report --workdir W [--out DIR]` or `intraskill report --bundle B --out DIR`.

    <workdir>/bundle/            the shareable bundle (always here; see bundle.py)
    <out>/index.html ...         the front page and seven chapters in English (index.zh.html ...: Chinese)
    <out>/plots/*.svg, *.png     the figures

From a run directory: the bundle is (re)built, checked, and the plots and pages drawn from it. From
a bundle alone (`--bundle`): it is checked and drawn; no run directory, model or GPU is needed, and
the pages are the ones its run's report has.

A run that is still going, was killed, or has no evaluation yet still gets a report of what is
complete; each gap is logged naming its file and listed on the front page.
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
    workdir = rundir.run_path(workdir)
    out_dir = rundir.run_path(out) if out is not None else rundir.report_dir(workdir)
    stages = ("read run", "bundle", "check bundle", "plots", "site")
    with as_progress(progress).stage("report", len(stages), unit="stage") as bar:
        bar.update(0, doing=stages[0])
        run = load_run(workdir)
        bar.update(doing=stages[1])
        bundle_dir = build_bundle(workdir, run=run)
        return _draw(bundle_dir, out_dir, bar, stages[2:])


def build_report_from_bundle(
    bundle: rundir.PathLike, out: rundir.PathLike, *, progress: bool | Progress = True
) -> Report:
    """Checks a bundle and draws its plots and site into `out`: no run directory needed.

    Raises:
      BundleError: the bundle is incomplete, altered, or its figures do not follow from its data.
    """
    stages = ("check bundle", "plots", "site")
    with as_progress(progress).stage("report", len(stages), unit="stage") as bar:
        return _draw(rundir.run_path(bundle), rundir.run_path(out), bar, stages)


def _draw(bundle_dir: epath.Path, out_dir: epath.Path, bar: Any, stages: Sequence[str]) -> Report:
    # Imported here: matplotlib is only needed once a report is actually drawn.
    from intraskill_jax.analysis import plots as plots_mod
    from intraskill_jax.analysis.site import build_site

    bar.update(0, doing=stages[0])
    check = check_bundle(bundle_dir)
    bar.update(doing=stages[1])
    plot_dir = out_dir / "plots"
    if plot_dir.is_dir():  # a plot that no longer has data must not survive from a rebuild
        for old in sorted([*plot_dir.glob("*.svg"), *plot_dir.glob("*.png")]):
            rundir.remove(old)
    data = load_bundle(bundle_dir, verify=False)
    written = plots_mod.write_plots(data.figures, plot_dir)
    bar.update(doing=stages[2])
    index = build_site(bundle_dir, out_dir)
    bar.update(doing="done")
    problems = tuple(Problem(**p) for p in data.problems)
    return Report(bundle_dir, out_dir, index, written, check, problems, data.figures)


def _define_flags(values: flags.FlagValues) -> None:
    flags.DEFINE_string("workdir", None, "the run directory (local or gs://)", flag_values=values)
    flags.DEFINE_string("bundle", None, "draw from this bundle alone instead of a run directory (needs --out)",
                        flag_values=values)
    flags.DEFINE_string("out", None, "site directory (default: <workdir>/report)", flag_values=values)
    flags.DEFINE_bool("quiet", False, "no progress bar", flag_values=values)


def main(argv: Sequence[str] | None = None) -> None:
    prog = "intraskill report"
    args = flagparse.parse(prog, __doc__, _define_flags, argv)
    if (args.workdir is None) == (args.bundle is None):
        flagparse.usage_error(prog, "give one of --workdir (a run directory) or --bundle (a bundle alone)")
    if args.bundle is not None and args.out is None:
        flagparse.usage_error(prog, "--bundle needs --out (where to write the report)")
    try:
        source = rundir.run_path(args.workdir or args.bundle)
        out = None if args.out is None else rundir.run_path(args.out)
    except (ValueError, ImportError) as e:
        flagparse.usage_error(prog, str(e))
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        if args.bundle is not None:
            report = build_report_from_bundle(source, out, progress=not args.quiet)
        else:
            report = build_report(source, out, progress=not args.quiet)
    except AnalysisInputError as e:
        log.error("%s", e)
        raise SystemExit(1) from None
    print_report(report, source)


def print_report(report: Report, workdir: str | os.PathLike) -> None:
    """Where the report went (and any problems found in the run directory)."""
    if report.problems:
        log.warning(
            "%d problem(s) in %s; the report shows what is complete (listed on its front page)",
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
