"""Comparing a number as the site writes it with the value in figures.json."""

from __future__ import annotations

from typing import Any

from intraskill_jax.analysis.site import fmt_value, resolve

_DECIMALS = {"f2": 2, "f3": 3, "+f3": 3, "pct1": 1, "pct2": 2, "+pp2": 2}


def assert_shown_equals_figure(figures: Any, ptr: str, fmt: str, text: str) -> None:
    """`text` shows the figure at `ptr` to the precision it is written with."""
    value = resolve(figures, ptr)
    where = f"{ptr} ({fmt}): shown {text!r}, figures.json has {value!r}"
    if value is None:
        assert text == "–", where
        return
    if fmt == "int":
        assert isinstance(value, int) and text == str(value), where
        return
    if fmt in ("g4", "si", "dur"):  # only written by Python: the exact string
        assert text == fmt_value(value, fmt), where
        return
    shown = text.strip().rstrip("%")
    scale = 100.0 if fmt in ("pct1", "pct2", "+pp2") else 1.0
    number = float(shown)
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    # The written precision is part of the format; within it only exact ties may round either
    # way (Python rounds half to even, JavaScript's toFixed half up).
    assert decimals == _DECIMALS[fmt], where
    if fmt.startswith("+"):
        assert shown[0] in "+-", where
    assert abs(number - value * scale) <= 0.5 * 10.0**-decimals + 1e-9, where
