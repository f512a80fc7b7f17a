"""The static report site: plain HTML, one CSS and one JS file, no network (works from file://).

A front page and seven chapters (`PAGES`), each in every language of `catalog.LANGS`: English at
`<name>.html`, Chinese at `<name>.zh.html`, with a switch to the other language on every page and the
same figures (`plots/`) in both. The pages' words come from the catalogues (`catalog/en.py`,
`catalog/zh.py`); the page builders (`front.py`, `chapters.py`, `evidence.py`) only place them.

Every number on a page comes from the bundle's figures.json and carries its JSON pointer and
format, `<span data-fig="/conditions/0/success" data-fmt="pct1">72.5%</span>`, so a test (or a
reader) can check each one against the bundle. Other facts (versions, texts of the trace and the
skill chunks) are the bundle's primary records, shown as recorded.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from etils import epath

from intraskill_jax import rundir
from intraskill_jax.analysis import catalog
from intraskill_jax.analysis.bundle import MANIFEST, BundleData, load_bundle, sha256

# (page name, catalogue key of its title); the front page first, then the chapters in order.
PAGES = (
    ("index", "nav.index"),
    ("method", "nav.method"),
    ("task", "nav.task"),
    ("protocol", "nav.protocol"),
    ("results", "nav.results"),
    ("behaviour", "nav.behaviour"),
    ("optimisation", "nav.optimisation"),
    ("reproduce", "nav.reproduce"),
)
ASSETS = Path(__file__).with_name("site_assets")
FORMATS = ("int", "f2", "f3", "+f3", "g4", "pct1", "pct2", "+pp2", "si", "dur")


def page_file(name: str, lang: str) -> str:
    """`index.html` for English, `index.zh.html` for Chinese: one folder, the same relative links."""
    return f"{name}.html" if lang == catalog.LANGS[0] else f"{name}.{lang}.html"


def fmt_value(value: Any, fmt: str) -> str:
    """How a figure is written on the page; `fmt` is one of `FORMATS`:
    int, f2, f3 (decimals), +f3 (signed), g4 (4 significant digits), pct1 / pct2 (a share as a
    percentage), +pp2 (a difference of shares in percentage points, signed), si (a count with
    K/M/B), dur (seconds: "4.2 s", "42 s", then [h:]m:ss)."""
    if value is None:
        return "–"
    if fmt == "int":
        return str(int(value))
    if fmt in ("pct1", "pct2"):
        return f"{100 * value:.{fmt[-1]}f}%"
    if fmt == "+pp2":
        return f"{100 * value:+.2f}"
    if fmt == "g4":
        return format(value, ".4g")
    if fmt == "si":
        for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
            if abs(value) >= size:
                return f"{value / size:.3g}{suffix}"
        return str(int(value))
    if fmt == "dur":
        if value < 60:  # a stage of seconds reads as seconds, not 0:00
            return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
        seconds = round(value)
        h, rest = divmod(seconds, 3600)
        m, s = divmod(rest, 60)
        return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"
    if fmt.startswith("+f"):
        return format(value, f"+.{fmt[2:]}f")
    if fmt.startswith("f"):
        return format(value, f".{fmt[1:]}f")
    raise ValueError(f"unknown number format {fmt!r}")


def pointer(*parts: str | int) -> str:
    """A JSON pointer (RFC 6901) into figures.json; metric names contain '/', escaped as ~1."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in parts)


def resolve(figures: Any, ptr: str) -> Any:
    """The value a JSON pointer names."""
    node = figures
    for raw in ptr.split("/")[1:]:
        key = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(key)] if isinstance(node, list) else node[key]
    return node


def esc(x: Any) -> str:
    return html.escape(str(x))


def code(x: Any, cls: str = "") -> str:
    """A recorded name or value as <code>, escaped."""
    return f'<code class="{cls}">{esc(x)}</code>' if cls else f"<code>{esc(x)}</code>"


class Page:
    """One page in one language: numbers from figures.json with their pointers, words from the
    catalogue, and the bundle's records for what is shown as recorded."""

    def __init__(self, name: str, lang: str, data: BundleData, plots: set[str], manifest: Mapping[str, Any],
                 manifest_sha: str | None = None):
        self.name, self.lang, self.data, self.plots, self.manifest = name, lang, data, plots, manifest
        self.manifest_sha = manifest_sha  # the bundle's identity: its manifest names every other file's hash
        self.figures: Mapping[str, Any] = data.figures or {}
        self.text = catalog.texts(lang)
        self.parts: list[str] = []

    # -- numbers ---------------------------------------------------------------------------------

    def num(self, fmt: str, *path: str | int) -> str:
        ptr = pointer(*path)
        value = resolve(self.figures, ptr)
        return f'<span class="num" data-fig="{ptr}" data-fmt="{fmt}">{fmt_value(value, fmt)}</span>'

    def maybe(self, fmt: str, *path: str | int) -> str:
        """A number that partial records may lack: a dash when absent."""
        try:
            return self.num(fmt, *path)
        except (KeyError, IndexError, TypeError):
            return "–"

    def value(self, *path: str | int, default: Any = None) -> Any:
        try:
            return resolve(self.figures, pointer(*path))
        except (KeyError, IndexError, TypeError):
            return default

    # -- words -----------------------------------------------------------------------------------

    def t(self, key: str, **values: str) -> str:
        """The catalogue's text `key` as inline HTML with `values` (HTML) filled in."""
        return catalog.render(self.text[key], values)

    def t_count(self, key: str, n: Any, **values: str) -> str:
        """`key`, or `key + ".one"` when `n` is 1 and the catalogue has that form (English plurals)."""
        return self.t(f"{key}.one" if n == 1 and f"{key}.one" in self.text else key, **values)

    def paras(self, key: str, **values: str) -> str:
        """The catalogue's text `key` as paragraphs (a blank line between them)."""
        return "".join(f"<p>{catalog.render(p, values)}</p>" for p in self.text[key].split("\n\n"))

    def items(self, key: str) -> list[str]:
        """The catalogue's list `key`, each entry as inline HTML."""
        return [catalog.render(x, {}) for x in self.text[key]]

    def link(self, name: str, anchor: str = "") -> str:
        """The href of page `name` in this page's language."""
        return page_file(name, self.lang) + (f"#{anchor}" if anchor else "")

    def a(self, name: str, anchor: str, label_key: str) -> str:
        """A link to `name#anchor` in this page's language, worded by the catalogue's `label_key`."""
        return f'<a href="{self.link(name, anchor)}">{self.t(label_key)}</a>'

    # -- building blocks -------------------------------------------------------------------------

    def add(self, *chunks: str) -> None:
        self.parts.extend(chunks)

    def section(self, anchor: str, title_key: str, **values: str) -> None:
        self.add(f'<h2 id="{anchor}">{self.t(title_key, **values)}</h2>')

    def empty(self, key: str, **values: str) -> None:
        self.add(f'<p class="empty">{self.t(key, **values)}</p>')

    def table(self, head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> None:
        """Cells are HTML already (numbers via `num`, words via `t`, records via `esc`)."""
        self.add(f'<div class="scroll"><table class="{cls}"><thead><tr>')
        self.add(*(f"<th>{h}</th>" for h in head))
        self.add("</tr></thead><tbody>")
        for row in rows:
            self.add("<tr>", *(f"<td>{c}</td>" for c in row), "</tr>")
        self.add("</tbody></table></div>")

    def plot(self, name: str, caption_key: str, **values: str) -> None:
        """The figure `plots/<name>.svg` (a PNG beside it) when the run had data for it."""
        if name not in self.plots:
            return
        caption = self.t(caption_key, **values)
        alt = html.escape(catalog.render(self.text[caption_key], {k: "" for k in values}), quote=True)
        self.add(
            f'<figure id="fig-{name}"><a href="plots/{name}.svg"><img src="plots/{name}.svg" alt="{alt}"></a>'
            f'<figcaption>{caption} <a href="plots/{name}.svg">SVG</a> · <a href="plots/{name}.png">PNG</a>'
            "</figcaption></figure>"
        )

    def sha256(self, rel: str) -> str | None:
        entry = (self.manifest.get("files") or {}).get(rel)
        return entry.get("sha256") if entry else None


Builder = Callable[[Page], None]


def _builders() -> dict[str, Builder]:
    from intraskill_jax.analysis import chapters, evidence, front

    return {
        "index": front.front_page,
        "method": chapters.method,
        "task": chapters.task,
        "protocol": chapters.protocol,
        "results": evidence.results,
        "behaviour": evidence.behaviour,
        "optimisation": evidence.optimisation,
        "reproduce": chapters.reproduce,
    }


def build_site(bundle_dir: rundir.PathLike, out_dir: rundir.PathLike) -> epath.Path:
    """Writes every page in every language into `out_dir` (plots, if any, are expected in
    `out_dir/plots/`); returns the path of the English front page, index.html."""
    data = load_bundle(bundle_dir)
    if data.figures is None:
        raise ValueError(f"{bundle_dir} has no figures.json; rebuild it with build_bundle")
    manifest = json.loads((data.root / MANIFEST).read_text(encoding="utf-8"))
    manifest_sha = sha256(data.root / MANIFEST)
    out = rundir.run_path(out_dir)
    for asset in ("site.css", "explorer.js"):
        rundir.write_bytes(out / "assets" / asset, (ASSETS / asset).read_bytes())
    plots = {p.stem for p in (out / "plots").glob("*.svg")} if (out / "plots").is_dir() else set()
    builders = _builders()
    for lang in catalog.LANGS:
        for name, _ in PAGES:
            page = Page(name, lang, data, plots, manifest, manifest_sha)
            builders[name](page)
            rundir.write_text(out / page_file(name, lang), _frame(page))
    return out / page_file("index", catalog.LANGS[0])


def run_name(data: BundleData) -> str:
    return str(data.config.get("name") or data.root.parent.name)


def _frame(page: Page) -> str:
    here = ' class="here" aria-current="page"'
    nav = "".join(
        f'<a href="{page.link(name)}"{here if name == page.name else ""}>'
        f'<span class="no">{i:02d}</span> {page.t(key)}</a>'
        for i, (name, key) in enumerate(PAGES)
    )
    others = "".join(
        f'<a class="lang" href="{page_file(page.name, lang)}" hreflang="{lang}" lang="{lang}">'
        f"{esc(catalog.LANG_NAMES[lang])}</a>"
        for lang in catalog.LANGS if lang != page.lang
    )
    order = [name for name, _ in PAGES]
    i = order.index(page.name)
    pager = "".join(
        f'<a class="{cls}" href="{page.link(order[j])}">{page.t(label)} · {page.t(dict(PAGES)[order[j]])}</a>'
        for cls, label, j in (("prev", "nav.prev", i - 1), ("next", "nav.next", i + 1)) if 0 <= j < len(order)
    )
    script = '<script src="assets/explorer.js"></script>' if page.name == "behaviour" else ""
    title = page.t(dict(PAGES)[page.name])
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="{page.lang}"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<link rel="icon" href="data:,">'  # no favicon request, so no 404 in the console
        f"<title>{title} · {page.t('site.name')} · {esc(run_name(page.data))}</title>"
        '<link rel="stylesheet" href="assets/site.css"></head><body>'
        f'<header class="top"><div class="bar"><a class="brand" href="{page.link("index")}">{page.t("site.name")}</a>'
        f'<span class="run">{page.t("site.run", name=esc(run_name(page.data)))}</span>{others}</div>'
        f'<nav class="chapters">{nav}</nav></header>'
        f'<main>{"".join(page.parts)}<nav class="pager">{pager}</nav></main>'
        f'<footer>{page.t("site.footer", sha=code((page.manifest_sha or "–")[:16], "hash"), link=page.link("reproduce", "check"))}</footer>'
        f"{script}</body></html>\n"
    )


# -- shared pieces ----------------------------------------------------------------------------


def chapter_head(page: Page, number: int) -> None:
    """The eyebrow, title and lead of chapter `number` (catalogue keys `ch<N>.*`)."""
    page.add(f'<p class="eyebrow">{number:02d} / {page.t(f"ch{number}.eyebrow")}</p>'
             f'<h1>{page.t(f"ch{number}.title")}</h1><div class="lead">{page.paras(f"ch{number}.lead")}</div>')


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
