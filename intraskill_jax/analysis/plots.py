"""The report's figures (matplotlib, Agg canvas; SVG and PNG), drawn only from figures.json.

Every plot function takes the figures dict and returns a matplotlib `Figure`, or None when the
run has nothing to show for it yet (e.g. no evaluation). Figures are built with the object API,
never pyplot, so nothing lingers in global state between calls.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from etils import epath

from matplotlib.axes import Axes
from matplotlib.ticker import MaxNLocator
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from intraskill_jax import rundir
from intraskill_jax.analysis.behaviour import BEHAVIOUR_FIELDS
from intraskill_jax.analysis.results import reward_label
from intraskill_jax.analysis.training import FUNNEL_STAGES, OPTIMISATION_METRICS

Figures = Mapping[str, Any]
PlotFn = Callable[[Figures], Figure | None]

_GOOD, _BAD, _SAME_OK, _SAME_FAIL = "#2e7d32", "#c62828", "#a5d6a7", "#cfcfcf"
# Values within this of each other are one value: exact zeros come back from sums and fits as
# +-1e-17, and matplotlib would zoom into that noise (an axis in units of 1e-17).
FLAT_SPAN = 1e-9
_LABELS = {
    "tokens_per_turn": "tokens per turn",
    "turns": "model steps",
    "searches": "searches",
    "product_visits": "product-page visits",
    "repairs": "repairs",
}


_RAW, _MEAN = {"alpha": 0.35, "lw": 1}, {"lw": 2.2}  # the study's "light: raw, solid: 5-step mean"
TRAINING_PANELS = (("rollout/reward_mean", "training reward (mean per step)"), ("rollout/success", "training success rate"))


def _series_panel(ax: Axes, fig: Figures, name: str, ylabel: str, color: str = "#1565c0") -> None:
    """One metric over steps: raw (light) and its trailing 5-step mean (solid), gates dashed.

    Steps carry a marker, so a metric logged at only a few steps (the update's, when most groups
    had no reward variance) still shows its points."""
    s = fig["training"]["series"][name]
    marker = {"marker": "o", "ms": 3} if len(s["step"]) <= 40 else {}
    ax.plot(s["step"], _nan(s["raw"]), color=color, label="raw", **_RAW, **marker)
    ax.plot(s["step"], _nan(s["mean"]), color=color, label="5-step mean", **_MEAN, **marker)
    for x in (g["step"] for g in fig["gates"]):
        ax.axvline(x, color="#888", ls="--", lw=0.8)
    ax.set_xlabel("rollout step")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    keep_readable_scale(ax, [*s["raw"], *s["mean"]], rate=_is_rate(name), floor=None if name in _SIGNED else 0.0)


def plot_training(fig: Figures) -> Figure | None:
    """The front page's curve: training reward and success (raw and 5-step mean, gates dashed) and
    the episodes generated and admitted to the update at each step."""
    series = fig["training"]["series"]
    panels = [(n, label) for n, label in TRAINING_PANELS if n in series]
    counts = [n for n in ("rollout/episodes_generated", "rollout/episodes_admitted") if n in series]
    if not panels and not counts:
        return None
    figure = Figure(figsize=(4.3 * (len(panels) + bool(counts)), 3.3), layout="constrained")
    axes = list(figure.subplots(1, len(panels) + bool(counts), squeeze=False).ravel())
    for ax, (name, label) in zip(axes, panels):
        _series_panel(ax, fig, name, label)
    axes[0].legend(fontsize=8)
    if counts:
        ax = axes[-1]
        width = 0.4
        for k, (name, label, color) in enumerate(zip(counts, ("generated", "admitted"), ("#90a4ae", "#1565c0"))):
            s = series[name]
            ax.bar([x + (k - 0.5) * width for x in s["step"]], _nan(s["raw"]), width, color=color, label=label)
        ax.set_xlabel("rollout step")
        ax.set_ylabel("episodes")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        # Above the axes: the bars reach the top wherever every episode was generated or admitted.
        ax.legend(fontsize=8, ncols=2, loc="lower center", bbox_to_anchor=(0.5, 1.0), frameon=False)
        ax.grid(axis="y", alpha=0.3)
        keep_readable_scale(ax, [v for n in counts for v in series[n]["raw"]], floor=0.0)
    return figure


def plot_optimisation(fig: Figures, cols: int = 3) -> Figure | None:
    """The optimisation chapter: entropy, PPO KL, clip fractions, gradient norm, throughput and
    truncation, one panel each (raw and 5-step mean)."""
    series = fig["training"]["series"]
    names = [n for n in OPTIMISATION_METRICS if n in series]
    if not names:
        return None
    cols = min(cols, len(names))
    rows = (len(names) + cols - 1) // cols
    figure = Figure(figsize=(4.2 * cols, 2.9 * rows), layout="constrained")
    axes = figure.subplots(rows, cols, squeeze=False).ravel()
    for ax, name in zip(axes, names):
        _series_panel(ax, fig, name, _METRIC_UNITS.get(name, "value"))
        ax.set_title(name, fontsize=9)
    for ax in axes[len(names):]:
        ax.set_visible(False)
    axes[0].legend(fontsize=8)
    return figure


_METRIC_UNITS = {
    "train/entropy": "nats per token",
    "train/ppo_kl": "KL (old || new)",
    "train/clipfrac_low": "share of tokens",
    "train/clipfrac_high": "share of tokens",
    "train/tis_clip_frac": "share of tokens",
    "train/grad_norm": "global L2 norm",
    "perf/rollout_generated_tokens_per_s": "tokens / s",
    "perf/update_tokens_per_s": "tokens / s",
    "rollout/truncation_rate": "share of episodes",
    "rollout/response_tokens_mean": "tokens per episode",
}


def plot_conditions(fig: Figures) -> Figure | None:
    """The run's reward, the strict reward and the success rate per test condition."""
    table = fig["conditions"]
    if not table:
        return None
    figure = Figure(figsize=(12, 3.4), layout="constrained")
    axes = figure.subplots(1, 3)
    labels = [f"{r['condition']}\n(n={r['n']})" for r in table]
    colors = ["#90a4ae" if r["policy"] == "base" else "#1565c0" for r in table]
    panels = (("reward", reward_label(fig["run"].get("reward"))), ("strict", "strict reward"),
              ("success", "success rate"))
    for ax, (key, title) in zip(axes, panels):
        values = [r[key] for r in table]
        bars = ax.bar(range(len(table)), values, color=colors)
        ax.bar_label(bars, labels=[f"{v:.1%}" if key == "success" else f"{v:.3f}" for v in values], fontsize=8)
        ax.set_xticks(range(len(table)), labels, fontsize=8)
        ax.set_ylim(0, max(1.0, max(values) * 1.15))
        ax.set_title(title)
        ax.set_ylabel("share of tasks" if key == "success" else "mean over tasks")
        ax.grid(axis="y", alpha=0.3)
    return figure


def plot_flips(fig: Figures) -> Figure | None:
    """Per paired comparison: tasks newly succeeding, regressing, and unchanged."""
    comps = fig["comparisons"]
    if not comps:
        return None
    figure = Figure(figsize=(9, 0.7 * len(comps) + 1.4), layout="constrained")
    ax = figure.subplots()
    parts = (
        ("newly_succeed", "newly succeed", _GOOD),
        ("regress", "regress", _BAD),
        ("both_succeed", "unchanged: success", _SAME_OK),
        ("both_fail", "unchanged: failure", _SAME_FAIL),
    )
    y = list(range(len(comps)))[::-1]
    left = [0] * len(comps)
    for key, label, color in parts:
        values = [c[key] for c in comps]
        ax.barh(y, values, left=left, color=color, label=label)
        left = [a + b for a, b in zip(left, values)]
    ax.set_yticks(
        y,
        [f"{c['a']} vs {c['b']}\nMcNemar p={_fmt(c['mcnemar_p'], '.3g')}" for c in comps],
        fontsize=8,
    )
    ax.set_xlabel("tasks")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8, ncols=4, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    return figure


def plot_behaviour(fig: Figures) -> Figure | None:
    """Behaviour per test condition, successes and failures side by side."""
    rows = fig["behaviour"]["by_condition"]
    conds = list(dict.fromkeys(r["condition"] for r in rows))
    if not conds:
        return None
    by = {(r["condition"], r["outcome"]): r for r in rows}
    figure = Figure(figsize=(3.2 * len(BEHAVIOUR_FIELDS), 3.4), layout="constrained")
    axes = figure.subplots(1, len(BEHAVIOUR_FIELDS))
    width = 0.38
    for ax, field in zip(axes, BEHAVIOUR_FIELDS):
        drawn: list[float] = []
        for k, (outcome, color) in enumerate((("success", _GOOD), ("failure", _BAD))):
            values = _nan([by[(c, outcome)][field] for c in conds])
            ax.bar([i + (k - 0.5) * width for i in range(len(conds))], values, width, color=color,
                   label=outcome)
            drawn += values
        ax.set_xticks(range(len(conds)), conds, rotation=30, ha="right", fontsize=8)
        ax.set_title(_LABELS[field], fontsize=10)
        ax.set_ylabel(f"mean {_LABELS[field]} per episode", fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        keep_readable_scale(ax, drawn, floor=0.0)
    axes[0].legend(fontsize=8)
    return figure


def plot_behaviour_checkpoints(fig: Figures) -> Figure | None:
    """Behaviour on the fixed validation tasks at each gate's checkpoint, per arm."""
    rows = [r for r in fig["behaviour"]["by_checkpoint"] if r["outcome"] == "all"]
    if not rows:
        return None
    arms = list(dict.fromkeys(r["arm"] for r in rows))
    figure = Figure(figsize=(3.2 * len(BEHAVIOUR_FIELDS), 3.0), layout="constrained")
    axes = figure.subplots(1, len(BEHAVIOUR_FIELDS))
    for ax, field in zip(axes, BEHAVIOUR_FIELDS):
        for arm in arms:
            sel = [r for r in rows if r["arm"] == arm]
            ax.plot([r["round"] for r in sel], _nan([r[field] for r in sel]), marker="o", label=arm)
        ax.set_title(_LABELS[field], fontsize=10)
        ax.set_xticks(sorted({r["round"] for r in rows}))
        ax.set_xlabel("gate round")
        ax.set_ylabel(f"mean {_LABELS[field]} per episode", fontsize=8)
        ax.grid(alpha=0.3)
        keep_readable_scale(ax, [r[field] for r in rows], floor=0.0)
    axes[0].legend(fontsize=8)
    return figure


def plot_contributions(fig: Figures, cols: int = 4) -> Figure | None:
    """Each chunk's contribution estimate (beta, 95% CI) at every gate it was tested in, one
    small panel per chunk on a shared y axis (a dozen overlaid intervals would be unreadable)."""
    rows = [r for r in fig["contributions"] if r["chunk"] is not None and r["beta"] is not None]
    if not rows:
        return None
    chunks = list(dict.fromkeys(r["chunk"] for r in rows))
    rounds = sorted({r["round"] for r in rows})
    cols = min(cols, len(chunks))
    n_rows = (len(chunks) + cols - 1) // cols
    figure = Figure(figsize=(3.0 * cols, 2.2 * n_rows), layout="constrained")
    axes = figure.subplots(n_rows, cols, squeeze=False, sharex=True, sharey=True).ravel()
    for ax, chunk in zip(axes, chunks):
        for kind, color in (("chunk", "#1565c0"), ("proposal", "#ef6c00")):
            sel = [r for r in rows if r["chunk"] == chunk and r["kind"] == kind]
            if not sel:
                continue
            low = [r["beta"] - r["ci_low"] if r["ci_low"] is not None else 0.0 for r in sel]
            high = [r["ci_high"] - r["beta"] if r["ci_high"] is not None else 0.0 for r in sel]
            ax.errorbar([r["round"] for r in sel], [r["beta"] for r in sel], yerr=[low, high],
                        fmt="o-", ms=4, capsize=2, lw=1, color=color, label=kind)
        ax.axhline(0, color="#444", lw=0.8)
        ax.set_title(chunk, fontsize=9)
        ax.set_xticks(rounds)
        ax.set_xlim(rounds[0] - 0.5, rounds[-1] + 0.5)
        ax.grid(alpha=0.3)
    for ax in axes[len(chunks) :]:
        ax.set_visible(False)
    # The axes share y: one range for every panel, from every drawn value.
    keep_readable_scale(axes[0], [v for r in rows for v in (r["beta"], r["ci_low"], r["ci_high"])])
    figure.suptitle("blue: the chunk's text of that round; orange: a proposal for it "
                    "(an addition, or a rewrite of it)", fontsize=9)
    figure.supxlabel("gate round", fontsize=9)
    # The gate fits the reward the episodes carry: the run's own (loose or strict).
    figure.supylabel(f"beta: gain in {reward_label(fig['run'].get('reward'))}, 95% CI", fontsize=9)
    return figure


def plot_funnel(fig: Figures) -> Figure | None:
    """Per round: failures, recovered by retry, analysed, proposals, rejected, accepted."""
    funnel = fig["funnel"]
    if not funnel:
        return None
    figure = Figure(figsize=(9, 3.4), layout="constrained")
    ax = figure.subplots()
    width = 0.8 / len(FUNNEL_STAGES)
    for k, stage in enumerate(FUNNEL_STAGES):
        x = [i + (k - len(FUNNEL_STAGES) / 2 + 0.5) * width for i in range(len(funnel))]
        bars = ax.bar(x, _nan([f[stage] for f in funnel]), width, label=stage.replace("_", " "))
        ax.bar_label(bars, labels=[_fmt(f[stage], "g") for f in funnel], fontsize=7)
    ax.set_xticks(range(len(funnel)), [f"round {f['round']}" for f in funnel])
    ax.set_ylabel("episodes or proposals")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend(fontsize=8, ncols=3)
    ax.grid(axis="y", alpha=0.3)
    keep_readable_scale(ax, [f[stage] for f in funnel for stage in FUNNEL_STAGES], floor=0.0)
    return figure


PLOTS: dict[str, PlotFn] = {
    "training": plot_training,
    "optimisation": plot_optimisation,
    "conditions": plot_conditions,
    "flips": plot_flips,
    "behaviour": plot_behaviour,
    "behaviour_checkpoints": plot_behaviour_checkpoints,
    "contributions": plot_contributions,
    "funnel": plot_funnel,
}


def write_plots(
    fig: Figures, out_dir: rundir.PathLike, names: Sequence[str] = tuple(PLOTS)
) -> dict[str, list[epath.Path]]:
    """Saves `<out_dir>/<name>.svg` and `.png` for each plot with data; returns name -> paths."""
    out = rundir.run_path(out_dir)
    written: dict[str, list[epath.Path]] = {}
    for name in names:
        figure = PLOTS[name](fig)
        if figure is None:
            continue
        # Rendered on an Agg canvas of its own: no display needed, and the process-wide
        # backend (e.g. a notebook's inline one) is left alone.
        FigureCanvasAgg(figure)
        paths = [out / f"{name}.svg", out / f"{name}.png"]
        # No timestamp in the SVG, so rebuilding an unchanged bundle gives identical files.
        for path, options in zip(paths, ({"format": "svg", "metadata": {"Date": None}}, {"format": "png", "dpi": 110})):
            buffer = io.BytesIO()  # rendered in memory: the report may live on gs://
            figure.savefig(buffer, **options)
            rundir.write_bytes(path, buffer.getvalue())
        written[name] = paths
    return written


def keep_readable_scale(
    ax: Axes, values: Iterable[float | None], *, rate: bool = False, floor: float | None = None
) -> None:
    """Gives a y axis whose values are all one value (within `FLAT_SPAN`) a fixed, readable range.

    Rates get [0, 1]; other values +-1 around the value, cut at `floor` (0 for counts). The offset
    and scientific notation are switched off, so the axis reads 0, not 1e-17.
    """
    finite = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not finite or max(finite) - min(finite) > FLAT_SPAN:
        return
    value = 0.0 if abs(finite[0]) < FLAT_SPAN else finite[0]
    if rate and 0.0 <= value <= 1.0:
        low, high = 0.0, 1.0
    else:
        low, high = value - 1.0, value + 1.0
        if floor is not None and low < floor <= value:
            low, high = floor, max(high, floor + 1.0)
    ax.set_ylim(low, high)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)


def _is_rate(metric: str) -> bool:
    last = metric.rsplit("/", 1)[-1]
    return last.endswith(("success", "rate", "share", "frac")) or "frac_" in last or last.startswith("clipfrac")


# Metrics that may be negative; any other drawn series is a count, rate, norm or size, kept >= 0
# when its values are flat.
_SIGNED = {"train/pg_loss", "train/loss", "train/ppo_kl"}


def _nan(values: Sequence[float | None]) -> list[float]:
    """matplotlib leaves gaps at NaN; JSON gave None for values that are not defined."""
    return [float("nan") if v is None else float(v) for v in values]


def _fmt(x: float | None, spec: str) -> str:
    return "n/a" if x is None else format(x, spec)
