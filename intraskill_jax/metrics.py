"""One metrics writer feeding TensorBoard (tensorboardX) and `metrics.jsonl`.

Names are slash-scoped with a fixed set of prefixes (train/, rollout/, skills/, gate/, eval/,
perf/), so dashboards group them and a typo'd scope fails loudly instead of making a new panel.
`metrics.jsonl` holds one JSON object per (step, scope) write; it is append-only and the source
the bundle and report are built from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

PREFIXES = ("train/", "rollout/", "skills/", "gate/", "eval/", "perf/")


class MetricsWriter:
    def __init__(self, workdir: str | os.PathLike, *, tensorboard: bool = True):
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.dir / "metrics.jsonl", "a", encoding="utf-8")
        self._tb = None
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(self.dir / "tb"))

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
        self._jsonl.write(json.dumps(row) + "\n")
        self._jsonl.flush()

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
    path = Path(workdir) / "metrics.jsonl"
    rows = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
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
