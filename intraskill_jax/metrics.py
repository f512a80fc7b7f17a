"""One metrics writer feeding TensorBoard (tensorboardX) and `metrics.jsonl`.

Names are slash-scoped with a fixed set of prefixes (train/, rollout/, skills/, gate/, eval/,
perf/), so dashboards group them and a typo'd scope fails loudly instead of making a new panel.
`metrics.jsonl` holds one JSON object per (step, scope) write; it is append-only and the source
the bundle and report are built from. Both live in the run directory, local or gs://
(`rundir.JsonlLog`; tensorboardX writes gs:// event files itself).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

from intraskill_jax import rundir

PREFIXES = ("train/", "rollout/", "skills/", "gate/", "eval/", "perf/")


class MetricsWriter:
    """Appends to `<workdir>/metrics.jsonl` and `<workdir>/tb/`.

    `rewind_to=s` (a resumed run restored at step s) first drops the rows written after step s
    (and, with `drop`, the rows it selects), and TensorBoard purges its events after s, so
    a killed-and-resumed run ends with the same records as an uninterrupted one.
    """

    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True, rewind_to: int | None = None):
        self.dir = rundir.run_path(workdir)
        self._jsonl = rundir.JsonlLog(rundir.metrics_path(workdir))
        if rewind_to is not None:
            self.rewind(lambda row: row["step"] > rewind_to)
        self._tb = None
        if tensorboard and rundir.is_writer():  # one writer of event files on several processes
            from tensorboardX import SummaryWriter

            purge = None if rewind_to is None else rewind_to + 1
            # A unique, time-ordered suffix: two writers in the same second (a fast resume) must
            # not share an event file, and readers order files by name.
            self._tb = SummaryWriter(str(rundir.tensorboard_dir(workdir)), purge_step=purge,
                                     filename_suffix=f".{time.time_ns():020d}")

    def rewind(self, drop: Callable[[dict[str, Any]], bool]) -> int:
        """Rewrites `metrics.jsonl` without the rows `drop` selects (and a torn last line)."""
        if not rundir.metrics_path(self.dir).exists():
            return 0
        rows = read_metrics(self.dir)
        kept = [r for r in rows if not drop(r)]
        self._jsonl.rewrite(kept)
        return len(rows) - len(kept)

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Scalars (floats, ints, bools, 0-d arrays); non-finite values are kept in JSON as null."""
        row: dict[str, Any] = {"step": int(step)}
        for name, value in metrics.items():
            if not name.startswith(PREFIXES):
                raise ValueError(f"metric {name!r} needs one of the prefixes {PREFIXES}")
            v = float(value)
            row[name] = v if math.isfinite(v) else None
            if self._tb is not None:
                self._tb.add_scalar(name, v, int(step))
        self._jsonl.append(row)

    def text(self, step: int, name: str, text: str) -> None:
        """A text summary (e.g. the skill bank of a round)."""
        if not name.startswith(PREFIXES):
            raise ValueError(f"text {name!r} needs one of the prefixes {PREFIXES}")
        if self._tb is not None:
            self._tb.add_text(name, text, int(step))

    def close(self) -> None:
        self._jsonl.close()
        if self._tb is not None:
            self._tb.close()

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_metrics(workdir: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of `metrics.jsonl`; a torn last line (a killed run) is skipped, not an error."""
    path = rundir.metrics_path(workdir)
    rows = []
    lines = path.read_text(encoding="utf-8").split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            if i >= len(lines) - 2:  # only the final line may be torn by a kill
                break
            raise ValueError(f"{path}: line {i + 1} is not JSON: {line[:80]!r}") from None
    return rows
