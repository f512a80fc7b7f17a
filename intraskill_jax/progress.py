"""One progress display across the stages of a job, with an ETA over everything that remains.

    progress = Progress([Planned("sft", 50, per_unit=3.0), Planned("evaluation", 800, per_unit=0.2)])
    with progress.stage("sft", total=54, unit="update") as bar:   # the exact total, once known
        for ...:
            bar.update(loss=0.41)

Stages run in any order and may be entered several times (a gate per round); time is charged to
the innermost open stage, and the part of it JAX spent compiling is told apart (`compile_seconds`):
compiling is a cost of new shapes, not of units. The quickstart compiles for most of its run, and
one step that met new shapes (85 s of compiling in an 89 s step, against ~6 s of work a step),
counted as work, multiplied the ETA tenfold.

A stage's remaining time is its work plus its compiling still to come. Work: the remaining units
at the stage's own observed rate (work seconds per unit over its updates after the first that did
not mostly compile), or, before that, at its prior rate scaled by how fast the job has worked
against its priors so far: against the priors of its own kind once a stage of that kind has a
rate (a model's training and its episodes scale differently from the tiny run the priors were
measured on; a stage may name kinds nearest first: an evaluation condition scales by the
conditions run before it, then by GRPO's episodes), else against all of them; a first unit
already done bounds that estimate (it took no less than a unit will). A stage whose work does not
grow with the model (`scales=False`: the report) keeps its prior. Compiling: the prior's `startup`, scaled by how the finished stages'
compiling compared with theirs, less what the stage has compiled so far. Units a resumed run
skips (`initial`) shorten the remainder without counting as speed.

Components take `progress: bool | Progress`; `as_progress(True)` gives a display of its own to a
component run alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

# Log lines as absl writes them (level letter, time, file:line), for the job's own records above
# the bar and for the libraries' warnings alike.
LOG_FORMAT = "%(levelname).1s %(asctime)s %(filename)s:%(lineno)d] %(message)s"
LOG_DATE_FORMAT = "%H:%M:%S"


@dataclasses.dataclass(frozen=True)
class Planned:
    """A stage the job expects (priors): `units` of work at `per_unit` seconds each, plus `startup`
    seconds of compiling over the stage (its first programs and those new shapes bring later)."""

    name: str
    units: int
    per_unit: float | None = None  # None: unknown until the stage has run two units
    startup: float = 0.0
    # Stages whose work scales together, the nearest first (default: the stage alone): an evaluation
    # condition's is ("evaluation", "episodes"), its sibling conditions before GRPO's steps and the gates.
    kind: str | tuple[str, ...] = ""
    scales: bool = True  # False: its work does not grow with the model (the report): its prior as it is


@dataclasses.dataclass
class _Stage:
    plan: Planned
    total: int
    unit: str = ""
    done: int = 0  # including units skipped on resume
    ran: int = 0  # units completed in this process
    seconds: float = 0.0  # time charged to this stage in this process
    compiling: float = 0.0  # the part of `seconds` JAX spent compiling
    first: tuple[float, int] | None = None  # (work seconds, ran) at the first update
    rated_work: float = 0.0  # over the updates that measure the rate (`record`)
    rated_units: int = 0
    mark: tuple[float, float] = (0.0, 0.0)  # (seconds, compiling) at the latest update

    @property
    def work(self) -> float:
        """Seconds charged here net of compiling."""
        return self.seconds - self.compiling

    def record(self, n: int) -> None:
        """Accounts an update of `n` units. The first, and any later one that spent most of its
        time compiling, is warm-up: a new program's first run costs more than its compiling (the
        quickstart's second SFT update: 1.6 s of work, against 0.6 s for the later ones)."""
        if n <= 0:
            return
        took, compiled = self.seconds - self.mark[0], self.compiling - self.mark[1]
        if self.first is None:
            self.first = (self.work, self.ran)
        elif compiled <= took / 2:
            self.rated_work += took - compiled
            self.rated_units += n
        self.mark = (self.seconds, self.compiling)

    def rate(self) -> float | None:
        """Observed work seconds per unit over the updates that measure it."""
        return self.rated_work / self.rated_units if self.rated_units else None

    @property
    def kinds(self) -> tuple[str, ...]:
        kind = self.plan.kind or self.plan.name
        return (kind,) if isinstance(kind, str) else kind

    def first_unit_speed(self) -> float | None:
        """Work seconds per unit of the first update(s) over the prior, while no rate is observed:
        an upper bound on this stage's speed, since those units paid for warming up too."""
        if self.first is None or self.rate() is not None or not self.plan.per_unit:
            return None
        return self.first[0] / (self.first[1] * self.plan.per_unit)


class _CompileTime:
    """Seconds this process has spent tracing, lowering and compiling JAX programs: the union of
    jax.monitoring's compile time spans (they nest and may overlap across threads; the summed
    durations came to more than the wall time), its listener registered on the first call."""

    def __init__(self):
        self._spans: list[list[float]] = []  # disjoint [start, end], sorted
        self._total = 0.0  # their summed lengths, kept with them: read at every tick of a display
        self._lock = threading.Lock()
        self._listening = False

    def _record(self, event: str, start: float, end: float, **_: Any) -> None:
        if not event.startswith("/jax/core/compile/"):
            return
        with self._lock:
            kept = []
            for span in self._spans:
                if span[1] < start or span[0] > end:
                    kept.append(span)
                else:
                    start, end = min(start, span[0]), max(end, span[1])
            kept.append([start, end])
            self._spans = sorted(kept)
            self._total = sum(b - a for a, b in self._spans)

    def __call__(self) -> float:
        if not self._listening:
            import jax.monitoring

            with self._lock:
                if not self._listening:
                    jax.monitoring.register_event_time_span_listener(self._record)
                    self._listening = True
        return self._total


compile_seconds = _CompileTime()


def format_seconds(seconds: float) -> str:
    seconds = max(0, round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h:d}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"


class Progress:
    """A single bar for the whole job (tqdm on stderr); see the module docstring."""

    def __init__(self, plan: Sequence[Planned] = (), *, enabled: bool = True, close_when_idle: bool = False,
                 clock: Callable[[], float] = time.perf_counter, compiling: Callable[[], float] = compile_seconds,
                 file: Any = None):
        """`close_when_idle`: end the display when its last open stage closes (a component's own
        display); otherwise it stays until `close()` (a job's, across its stages). `compiling`: the
        process's compile time so far (`clock`'s seconds), taken out of the stages' rates."""
        self.enabled, self._close_when_idle = enabled, close_when_idle
        self._clock, self._compiling = clock, compiling
        self._stages: dict[str, _Stage] = {p.name: _Stage(p, p.units) for p in plan}
        self._open: list[tuple[_Stage, dict[str, Any]]] = []
        self._last, self._last_compiling = clock(), compiling()
        self._start = self._last
        self._file = file
        self._bar = None

    def __bool__(self) -> bool:
        return self.enabled

    # -- the estimate ----------------------------------------------------------------------------

    def _speed(self, kinds: tuple[str, ...]) -> float:
        """Observed / prior work seconds: over the rated stages of the nearest of `kinds` that has
        one, else over all rated stages (1.0 before any), capped by the first units of the first kind."""
        def ratio(stages: list[_Stage]) -> float | None:
            observed = prior = 0.0
            for s in stages:
                r = s.rate()
                if r is not None and s.plan.per_unit:
                    observed += r * s.rated_units
                    prior += s.plan.per_unit * s.rated_units
            return observed / prior if prior > 0 else None

        of = {kind: [s for s in self._stages.values() if kind in s.kinds] for kind in kinds}
        nearest = next((r for kind in kinds if (r := ratio(of[kind]))), None)
        speed = nearest or ratio(list(self._stages.values())) or 1.0
        bounds = [b for s in of[kinds[0]] if (b := s.first_unit_speed()) is not None]
        return min([speed, *bounds])

    def _compile_speed(self) -> float:
        """Observed / prior compiling over the stages that have finished (1.0 before any): a larger
        model compiles longer, but not by the factor its work costs more."""
        done = [s for s in self._stages.values() if s.ran and s.done >= s.total and s.plan.startup > 0]
        return sum(s.compiling for s in done) / sum(s.plan.startup for s in done) if done else 1.0

    def remaining(self) -> float | None:
        """Seconds left in the whole job; None while a stage's cost is still unknown."""
        left, compile_speed = 0.0, self._compile_speed()
        for s in self._stages.values():
            units = max(s.total - s.done, 0)
            if units == 0:
                continue
            rate = s.rate()
            if rate is None:
                if s.plan.per_unit is None:
                    return None
                rate = s.plan.per_unit * (self._speed(s.kinds) if s.plan.scales else 1.0)
            work = units * rate - (s.work if s.ran == 0 else 0.0)  # a first unit under way
            left += max(work, 0.0) + max(s.plan.startup * compile_speed - s.compiling, 0.0)
        return left

    def elapsed(self) -> float:
        return self._clock() - self._start

    # -- stages ----------------------------------------------------------------------------------

    def stage(self, name: str, total: int | None = None, *, unit: str = "", initial: int = 0) -> _Handle:
        """Enters stage `name` (planned or not); `total` replaces the plan's estimate of its units."""
        self._tick()
        s = self._stages.get(name)
        if s is None:
            s = self._stages[name] = _Stage(Planned(name, total or 0), total or 0)
        # Planned stages before this one that never ran were skipped (done on an earlier run).
        open_now = {id(o) for o, _ in self._open}
        for earlier in list(self._stages.values())[: list(self._stages).index(name)]:
            if earlier.ran == 0 and id(earlier) not in open_now:
                earlier.total = earlier.done
        if total is not None:
            s.total = total
        s.unit = unit or s.unit
        s.done = max(s.done, initial)
        self._open.append((s, {}))
        self._render()
        return _Handle(self, s)

    def _tick(self) -> None:
        now, compiling = self._clock(), self._compiling()
        if self._open:
            s = self._open[-1][0]
            s.seconds += now - self._last
            s.compiling += min(compiling - self._last_compiling, now - self._last)
        self._last, self._last_compiling = now, compiling

    def _advance(self, s: _Stage, n: int, info: dict[str, Any]) -> None:
        self._tick()
        s.done += n
        s.ran += n
        s.record(n)
        for stage, extra in self._open:
            if stage is s:
                extra.update(info)
        self._render()

    def _close(self, s: _Stage) -> None:
        self._tick()
        for i in range(len(self._open) - 1, -1, -1):
            if self._open[i][0] is s:
                del self._open[i]
                break
        self._render()
        if not self._open and self._close_when_idle:
            self.close()

    # -- display ---------------------------------------------------------------------------------

    def status(self) -> str:
        """One line: the current stage, its units, the job's elapsed time and ETA."""
        names = list(self._stages)
        left = self.remaining()
        eta = "?" if left is None else format_seconds(left)
        parts = [f"elapsed {format_seconds(self.elapsed())}, ETA {eta}"]
        if self._open:
            s, info = self._open[-1]
            where = f"[{names.index(s.plan.name) + 1}/{len(names)}] {s.plan.name}"
            count = f"{s.done}/{s.total} {s.unit}".strip() if s.total else ""
            extra = " ".join(f"{k}={v}" for k, v in info.items())
            parts = [" ".join(p for p in (where, count, extra) if p), *parts]
        return " | ".join(parts)

    def _render(self) -> None:
        if not self.enabled:
            return
        left, elapsed = self.remaining(), self.elapsed()
        fraction = elapsed / (elapsed + left) if left is not None and elapsed + left > 0 else 0.0
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=1000, bar_format="{bar:20}| {desc}", file=self._file or sys.stderr,
                             dynamic_ncols=True, leave=True)
        self._bar.n = min(int(1000 * fraction), 1000)
        self._bar.set_description_str(self.status(), refresh=False)
        self._bar.refresh()

    def write(self, text: str) -> None:
        """Prints a line without breaking the bar."""
        if self._bar is not None:
            self._bar.write(text)
        else:
            print(text)

    @contextlib.contextmanager
    def logging_to_bar(self, *names: str) -> Iterator[None]:
        """Log records of loggers `names` print above the bar instead of through it."""
        handler = _BarHandler(self)
        handler.setFormatter(logging.Formatter(LOG_FORMAT, datefmt=LOG_DATE_FORMAT))
        loggers = [logging.getLogger(n) for n in names]
        saved = [lg.propagate for lg in loggers]
        for lg in loggers:
            lg.addHandler(handler)
            lg.propagate = False
        try:
            yield
        finally:
            for lg, propagate in zip(loggers, saved):
                lg.removeHandler(handler)
                lg.propagate = propagate

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _BarHandler(logging.Handler):
    def __init__(self, progress: Progress):
        super().__init__()
        self._progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - logging must never raise into the job
            self.handleError(record)
            return
        if self._progress._bar is not None:
            self._progress._bar.write(text, file=self._progress._file or sys.stderr)
        else:
            print(text, file=sys.stderr)


class _Handle:
    """An open stage: `update(n, **info)` completes units (info shows beside the count)."""

    def __init__(self, progress: Progress, stage: _Stage):
        self._progress, self._stage = progress, stage

    def update(self, n: int = 1, **info: Any) -> None:
        self._progress._advance(self._stage, n, {k: _short(v) for k, v in info.items()})

    def close(self) -> None:
        self._progress._close(self._stage)

    def __enter__(self) -> _Handle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _short(value: Any) -> str:
    if isinstance(value, float) and math.isfinite(value):
        return f"{value:.4g}"
    return str(value)


def as_progress(progress: bool | Progress) -> Progress:
    """`progress` itself, or a display of its own (shown when `progress` is true)."""
    return progress if isinstance(progress, Progress) else Progress(enabled=bool(progress), close_when_idle=True)
