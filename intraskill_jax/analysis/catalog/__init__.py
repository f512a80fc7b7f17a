"""Every word the report shows, one module per language: `en.py`, `zh.py` (`TEXT`: key -> text).

The site's code holds no prose: it asks for a key (`text(lang, key, **values)`) and places the
result. A text is plain: it is HTML-escaped when shown; `code` in backticks becomes <code>; a blank
line starts a new paragraph (`Page.paras`); `key.one` is the form of `key` for a count of one, in the
languages that need one (`Page.t_count`); `{name}` is a value the page fills in (a number from
figures.json with its pointer, a name, a link), the same names in every language. A key whose value
is a list holds several such texts (the steps of the loop, say). `check()` (and a test) keeps the
languages in step: the same keys, the same placeholders.
"""

from __future__ import annotations

import html
import importlib
import re
import string
from collections.abc import Mapping
from typing import Any

LANGS = ("en", "zh")
LANG_NAMES = {"en": "English", "zh": "中文"}
_CODE = re.compile(r"`([^`]+)`")


def texts(lang: str) -> Mapping[str, Any]:
    """The catalogue of `lang`."""
    if lang not in LANGS:
        raise ValueError(f"no report text for language {lang!r}; available: {', '.join(LANGS)}")
    return importlib.import_module(f"{__name__}.{lang}").TEXT


def placeholders(text: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(text) if name}


def render(text: str, values: Mapping[str, str]) -> str:
    """`text` as HTML: escaped, backticks as <code>, `{name}` replaced by `values[name]` (HTML)."""
    out = _CODE.sub(lambda m: f"<code>{m.group(1)}</code>", html.escape(text, quote=False))
    return out.format_map(values) if placeholders(text) else out


def check() -> list[str]:
    """Differences between the catalogues: keys one lacks, placeholders that differ, list lengths."""
    problems = []
    base = texts(LANGS[0])
    for lang in LANGS[1:]:
        other = texts(lang)
        for key in sorted(set(base) ^ set(other)):
            if key.endswith(".one"):  # a plural form only some languages need (`Page.t_count`)
                continue
            problems.append(f"{key}: only in {LANGS[0] if key in base else lang}")
        for key in sorted(set(base) & set(other)):
            a, b = base[key], other[key]
            if isinstance(a, list) != isinstance(b, list) or (isinstance(a, list) and len(a) != len(b)):
                problems.append(f"{key}: {LANGS[0]} and {lang} differ in shape")
                continue
            for x, y in zip(a if isinstance(a, list) else [a], b if isinstance(b, list) else [b]):
                if placeholders(x) != placeholders(y):
                    problems.append(f"{key}: placeholders {sorted(placeholders(x))} vs {sorted(placeholders(y))}")
    return problems
