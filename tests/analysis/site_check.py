"""Comparing a number as the site writes it with the value in figures.json."""

from __future__ import annotations

from typing import Any

from intraskill_jax.analysis.site import resolve


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
    shown = text.strip().rstrip("%")
    scale = 100.0 if fmt == "pct1" else 1.0
    number = float(shown)
    if fmt == "g4":  # only written by Python: the exact string
        assert text == format(value, ".4g"), where
        return
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    # The written precision is part of the format; within it only exact ties may round either
    # way (Python rounds half to even, JavaScript's toFixed half up).
    assert decimals == {"f2": 2, "f3": 3, "+f3": 3, "pct1": 1}[fmt], where
    if fmt == "+f3":
        assert shown[0] in "+-", where
    assert abs(number - value * scale) <= 0.5 * 10.0**-decimals + 1e-9, where
