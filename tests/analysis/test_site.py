"""The static site: a front page and seven chapters in English and Chinese, offline, every number
equal to the bundle's figures, the texts of every round, and the same pages from the bundle alone.

The browser tests load every page of both languages in Debian's headless chromium (selenium),
read the console, check that images loaded and every link resolves (its file and its anchor),
compare every marked number in the live DOM (including those the behaviour explorer renders with
JavaScript, before and after filtering) with figures.json, and leave screenshots of the front page
and the task chapter in each language under the run's `report/screenshots/`.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import tempfile
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from intraskill_jax.analysis import catalog
from intraskill_jax.analysis.site import PAGES, fmt_value, page_file, pointer, resolve
from tests.analysis.site_check import assert_shown_equals_figure

ALL_PAGES = [(name, lang) for lang in catalog.LANGS for name, _ in PAGES]
SCREENSHOTS = ("index", "task")  # the front page and one chapter, in each language


class _Html(HTMLParser):
    """Collects (pointer, format, text) of every data-fig element, every src/href and every id."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: list[tuple[str, str, str]] = []
        self.links: list[str] = []
        self.ids: set[str] = set()
        self._open: list[tuple[str, str] | None] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.links += [a[k] for k in ("src", "href") if k in a]
        if "id" in a:
            self.ids.add(a["id"])
        if "data-fig" in a:
            self._open.append((a["data-fig"], a["data-fmt"]))
            self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._open:
            ptr, fmt = self._open.pop()
            self.numbers.append((ptr, fmt, "".join(self._text)))


def _parse(path: Path) -> _Html:
    parser = _Html()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def test_fmt_and_pointer() -> None:
    assert fmt_value(0.7251, "pct1") == "72.5%" and fmt_value(0.5175, "pct2") == "51.75%"
    assert fmt_value(0.325, "+pp2") == "+32.50" and fmt_value(-0.005, "+pp2") == "-0.50"
    assert fmt_value(None, "f3") == "–" and fmt_value(0.05, "+f3") == "+0.050" and fmt_value(3, "int") == "3"
    assert fmt_value(201208, "si") == "201K" and fmt_value(4.02e9, "si") == "4.02B" and fmt_value(512, "si") == "512"
    assert fmt_value(3725.4, "dur") == "1:02:05" and fmt_value(65, "dur") == "1:05"
    assert pointer("training", "final", "train/pg_loss", "raw") == "/training/final/train~1pg_loss/raw"
    assert resolve({"a/b": [1, {"c~": 2}]}, "/a~1b/1/c~0") == 2
    assert page_file("index", "en") == "index.html" and page_file("task", "zh") == "task.zh.html"


def test_number_check_catches_wrong_values() -> None:
    figures = {"x": 0.5, "k": 3, "none": None, "s": 65.0}
    assert_shown_equals_figure(figures, "/x", "pct1", "50.0%")
    assert_shown_equals_figure(figures, "/x", "+pp2", "+50.00")
    for ptr, fmt, text in (("/x", "f3", "0.600"), ("/x", "f3", "0.50"), ("/x", "+f3", "0.500"),
                           ("/k", "int", "4"), ("/none", "f2", "0.00"), ("/x", "g4", "0.5001"),
                           ("/x", "pct2", "50.0%"), ("/x", "+pp2", "50.00"), ("/s", "dur", "1:06")):
        with pytest.raises(AssertionError):
            assert_shown_equals_figure(figures, ptr, fmt, text)


def test_catalogues_agree() -> None:
    """Both languages have every key, with the same placeholders; no key renders to nothing."""
    assert catalog.check() == []
    for lang in catalog.LANGS:
        for key, text in catalog.texts(lang).items():
            assert all(t.strip() for t in (text if isinstance(text, list) else [text])), (lang, key)
    zh = catalog.texts("zh")
    assert re.search(r"[\u4e00-\u9fff]", zh["ch1.why"]) and zh["ch1.why"] != catalog.texts("en")["ch1.why"]


def test_pages_are_offline_and_numbers_match(report, figures: dict) -> None:
    site = report.out
    seen = 0
    ids = {p.name: _parse(p).ids for p in site.glob("*.html")}
    for name, lang in ALL_PAGES:
        path = site / page_file(name, lang)
        parser = _parse(path)
        for link in parser.links:
            assert not re.match(r"^(https?:)?//", link), f"{path.name} links outside: {link}"
            if link.startswith("data:"):
                continue
            target, _, anchor = link.partition("#")
            target = target or path.name
            assert (site / target).is_file(), f"{path.name}: {link} is not in the site"
            if anchor:
                assert anchor in ids[target], f"{path.name}: {link} names no element of {target}"
        for ptr, fmt, shown in parser.numbers:
            assert_shown_equals_figure(figures, ptr, fmt, shown)
        seen += len(parser.numbers)
        text = path.read_text(encoding="utf-8")
        # Every page switches to the same page in the other language.
        other = [x for x in catalog.LANGS if x != lang][0]
        assert f'<a class="lang" href="{page_file(name, other)}" hreflang="{other}"' in text, path.name
        assert f'<html lang="{lang}">' in text
    for path in site.glob("assets/*"):  # (a page may show a URL the config holds, as text)
        assert "http://" not in path.read_text() and "https://" not in path.read_text(), path
    assert seen > 1000
    results = (site / "results.html").read_text()
    assert 'data-fig="/comparisons/0/mcnemar_p"' in results and 'data-fig="/conditions/3/success"' in results


def _headline(figures: dict) -> dict:
    i = figures["headline"]["training"]
    c = figures["comparisons"][i]
    assert (c["a"], c["b"]) == ("trained_bare", "base_bare")
    return c


@pytest.mark.parametrize("lang", catalog.LANGS)
def test_front_page_leads_with_the_headline(report, figures: dict, lang: str) -> None:
    page = (report.out / page_file("index", lang)).read_text(encoding="utf-8")
    c = _headline(figures)
    i = figures["headline"]["training"]
    shown = {ptr: text for ptr, _, text in _parse(report.out / page_file("index", lang)).numbers}
    # base -> trained success without the skill, the delta in points, on how many tasks, from one run
    assert shown[f"/comparisons/{i}/success_b"] == fmt_value(c["success_b"], "pct2")
    assert shown[f"/comparisons/{i}/success_a"] == fmt_value(c["success_a"], "pct2")
    assert shown[f"/comparisons/{i}/success_diff"] == fmt_value(c["success_diff"], "+pp2")
    assert shown[f"/comparisons/{i}/n"] == str(c["n"]) and shown["/run/training_runs"] == "1"
    assert page.index('id="headline"') < page.index('id="guide"') < page.index('id="evaluation"') < page.index('id="training"')
    # key counts, the four conditions, the flips, what the final skill adds, the curve and its counts
    for ptr in ("/run/parameters", "/run/steps", "/run/rounds_closed", "/run/initial_chunks", "/run/final_chunks",
                f"/comparisons/{i}/newly_succeed", f"/comparisons/{i}/regress", f"/comparisons/{i}/both_succeed",
                "/training_funnel/episodes_generated", "/training_funnel/episodes_admitted"):
        assert ptr in shown, ptr
    j = figures["headline"]["final_skill"]
    assert figures["comparisons"][j]["a"] == "trained_skill" and figures["comparisons"][j]["b"] == "trained_bare"
    assert {f"/comparisons/{j}/success_{k}" for k in ("diff", "ci_low", "ci_high")} <= set(shown)
    assert all(f"/conditions/{k}/{o}" in shown for k in range(4) for o in ("reward", "strict", "success"))
    assert 'src="plots/training.svg"' in page
    for k, (name, _) in enumerate(PAGES[1:], start=1):
        assert f'href="{page_file(name, lang)}"' in page  # the reading guide
        assert html.escape(catalog.texts(lang)[f"ch{k}.question"], quote=False) in page


def test_results_page_matches_the_terminal_summary(report, run_dir: Path, figures: dict) -> None:
    from intraskill_jax.analysis.summary import format_summary

    shown = {ptr: text for ptr, _, text in _parse(report.out / "results.html").numbers}
    summary = format_summary(run_dir)
    c = figures["conditions"][3]
    row = next(line for line in summary.splitlines() if line.startswith(c["condition"] + " "))
    assert row.split()[-3:] == [shown["/conditions/3/reward"], shown["/conditions/3/strict"],
                                shown["/conditions/3/success"]]
    assert (f'{shown["/comparisons/0/reward_diff"]} [{shown["/comparisons/0/reward_ci_low"]}, '
            f'{shown["/comparisons/0/reward_ci_high"]}]') in summary


def test_chapters_hold_what_the_study_reports(report, figures: dict) -> None:
    site = report.out
    task = (site / "task.html").read_text(encoding="utf-8")
    trace = json.loads((report.bundle / "traces.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert 'id="trace-' in task
    shown = re.search(r'<details class="trace" id="trace-(\d+)" open>(.*?)<nav class="pager">', task, re.S)
    chosen = json.loads((report.bundle / "traces.jsonl").read_text(encoding="utf-8").splitlines()[int(shown.group(1))])
    for turn in chosen["transcript"]:  # every turn's reply and observation, as the policy saw them
        assert html.escape(turn["reply"]) in shown.group(2)
        if turn["observation"]:
            assert html.escape(turn["observation"]) in shown.group(2)
    assert html.escape(chosen["prompt"]) in shown.group(2) and trace["condition"]
    protocol = (site / "protocol.html").read_text(encoding="utf-8")
    manifest = json.loads((report.bundle / "manifest.json").read_text())
    assert manifest["files"]["config.json"]["sha256"] in protocol
    for name in ("jax", "flax", "optax"):
        assert f"<code>{name}</code>" in protocol
    assert "/protocol/stage_totals/0/seconds" in protocol and "/protocol/splits/train" in protocol
    results = (site / "results.html").read_text(encoding="utf-8")
    assert 'id="controls"' in results and "plain_grpo" in results
    reproduce = (site / "reproduce.html").read_text(encoding="utf-8")
    for rel, entry in manifest["files"].items():
        assert f"<code>{rel}</code>" in reproduce and entry["sha256"] in reproduce
    assert "intraskill check-bundle" in reproduce
    optimisation = (site / "optimisation.html").read_text(encoding="utf-8")
    assert 'src="plots/optimisation.svg"' in optimisation and "/training/final/train~1entropy/raw" in optimisation


def test_skill_texts_of_every_round(report) -> None:
    for lang in catalog.LANGS:
        page = (report.out / page_file("results", lang)).read_text(encoding="utf-8")
        for p in sorted((report.bundle / "skills").glob("round_*.json")):
            s = json.loads(p.read_text(encoding="utf-8"))
            for c in s["chunks"]:
                article = re.search(
                    rf'<article class="chunk [a-z]+" data-round="{s["round"]}" data-chunk="{c["id"]}">(.*?)</article>',
                    page, re.S)
                assert article, (lang, s["round"], c["id"])
                body = article.group(1)
                # Both texts verbatim, the page's own language first.
                en, zh = (body.index(f'data-lang="{x}">{html.escape(c[x])}</div>') for x in ("en", "zh"))
                assert (en < zh) == (lang == "en")


def test_report_from_the_bundle_alone(report, tmp_path: Path) -> None:
    """The bundle copied away from its run directory draws the same pages."""
    from intraskill_jax.analysis import report as report_mod

    bundle = Path(shutil.copytree(report.bundle, tmp_path / "elsewhere" / "bundle"))
    report_mod.main(["--bundle", str(bundle), "--out", str(tmp_path / "site"), "--quiet"])
    for name, lang in ALL_PAGES:
        rel = page_file(name, lang)
        assert (tmp_path / "site" / rel).read_text(encoding="utf-8") == (report.out / rel).read_text(encoding="utf-8"), rel
    assert {p.name for p in (tmp_path / "site" / "plots").iterdir()} == {p.name for p in (report.out / "plots").iterdir()}


# -- in a real browser ------------------------------------------------------------------------


def _must_have_browser() -> bool:
    """CI (and root, where .ci/run installs chromium) must run the browser tests, not skip them."""
    return bool(os.environ.get("CI")) or (hasattr(os, "geteuid") and os.geteuid() == 0)


@pytest.fixture(scope="module")
def browser():
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_bin):
        why = ("chromium and chromedriver are not installed: apt-get install -y chromium chromium-driver "
               "(.ci/run installs them when it runs as root)")
        (pytest.fail if _must_have_browser() else pytest.skip)(why)
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        (pytest.fail if _must_have_browser() else pytest.skip)("selenium is in the [test] extra")
    profile = tempfile.mkdtemp(prefix="intraskill-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", f"--user-data-dir={profile}", "--window-size=1280,1000"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    yield driver
    driver.quit()
    shutil.rmtree(profile, ignore_errors=True)


_NUMBERS_JS = (
    "return Array.from(document.querySelectorAll('[data-fig]'))"
    ".map(e => [e.dataset.fig, e.dataset.fmt, e.textContent]);"
)
_EXPLORER_NUMBERS_JS = _NUMBERS_JS.replace("'[data-fig]'", "'#explorer [data-fig]'")


def _load(browser, page: Path) -> list[list[str]]:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page.resolve().as_uri())
    # get() may return before a file:// page finishes on a busy machine: wait for the load event.
    WebDriverWait(browser, 30).until(lambda d: d.execute_script("return document.readyState") == "complete")
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"{page.name}: console errors {errors}"
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src);")
    assert not broken, f"{page.name}: images that did not load: {broken}"
    return browser.execute_script(_NUMBERS_JS)


def _screenshot(browser, path: Path) -> None:
    """The whole page (up to 12,000 CSS pixels tall) as a PNG."""
    import base64

    size = browser.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], 12000), "scale": 1}})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(base64.b64decode(shot["data"]))


def test_pages_in_chromium(browser, report, figures: dict) -> None:
    site = Path(report.out).resolve()
    ids = {p.name: _parse(p).ids for p in site.glob("*.html")}
    c = _headline(figures)
    for name, lang in ALL_PAGES:
        path = site / page_file(name, lang)
        numbers = _load(browser, path)
        assert catalog.texts(lang)[dict(PAGES)[name]] in browser.title
        assert browser.execute_script("return document.documentElement.lang") == lang
        assert numbers or name == "reproduce", path.name  # (the reproduce chapter shows hashes, not figures)
        for ptr, fmt, text in numbers:
            assert_shown_equals_figure(figures, ptr, fmt, text)
        # Every link resolves to a file of the site and, with an anchor, to an element of it.
        for href in browser.execute_script("return Array.from(document.querySelectorAll('a[href]')).map(a => a.href)"):
            url = urlparse(href)
            assert url.scheme == "file", f"{path.name} links outside: {href}"
            target = Path(unquote(url.path))
            assert target.is_file() and target.is_relative_to(site), f"{path.name}: broken link {href}"
            if url.fragment and target.suffix == ".html":
                assert url.fragment in ids[target.name], f"{path.name}: {href} names no element"
        nav = browser.execute_script("return Array.from(document.querySelectorAll('nav.chapters a')).map(a => a.href)")
        assert [h.rsplit("/", 1)[1] for h in nav] == [page_file(p, lang) for p, _ in PAGES]
        if name == "index":  # the headline as the reader sees it
            shown = browser.execute_script(
                "const h = document.getElementById('headline');"
                "return [h.querySelector('.from').textContent, h.querySelector('.to').textContent];")
            assert shown == [fmt_value(c["success_b"], "pct2"), fmt_value(c["success_a"], "pct2")]
        if name in SCREENSHOTS:
            _screenshot(browser, report.out / "screenshots" / f"{name}.{lang}.png")
    for name in SCREENSHOTS:
        for lang in catalog.LANGS:
            assert (report.out / "screenshots" / f"{name}.{lang}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_language_switch_in_chromium(browser, report) -> None:
    from selenium.webdriver.common.by import By

    for name, lang in ALL_PAGES:
        _load(browser, report.out / page_file(name, lang))
        browser.find_element(By.CSS_SELECTOR, "a.lang").click()
        other = [x for x in catalog.LANGS if x != lang][0]
        assert browser.current_url.endswith("/" + page_file(name, other))
        assert browser.execute_script("return document.documentElement.lang") == other


@pytest.mark.parametrize("lang", catalog.LANGS)
def test_behaviour_explorer_filters_in_chromium(browser, report, figures: dict, lang: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _load(browser, report.out / page_file("behaviour", lang))
    beh = figures["behaviour"]
    rows = lambda: browser.find_elements(By.CSS_SELECTOR, "#explorer tbody tr")  # noqa: E731
    n_all = sum(r["outcome"] == "all" for key in beh for r in beh[key])
    assert len(rows()) == n_all

    Select(browser.find_element(By.ID, "f-outcome")).select_by_value("failure")
    Select(browser.find_element(By.ID, "f-source")).select_by_value("validation")
    shown = rows()
    assert len(shown) == sum(r["outcome"] == "failure" for r in beh["by_checkpoint"])
    assert {(tr.get_attribute("data-source"), tr.get_attribute("data-outcome")) for tr in shown} == {
        ("validation", "failure")}
    words = catalog.texts(lang)
    assert {tr.find_elements(By.TAG_NAME, "td")[2].text for tr in shown} == {words["outcome.failure"]}
    for ptr, fmt, text in browser.execute_script(_EXPLORER_NUMBERS_JS):
        assert ptr.startswith("/behaviour/by_checkpoint/")
        assert resolve(figures, ptr.rsplit("/", 1)[0])["outcome"] == "failure"
        assert_shown_equals_figure(figures, ptr, fmt, text)

    Select(browser.find_element(By.ID, "f-source")).select_by_value("test")
    Select(browser.find_element(By.ID, "f-outcome")).select_by_value("split")
    box = browser.find_element(By.ID, "f-group")
    box.send_keys("trained")
    groups = {tr.find_elements(By.TAG_NAME, "td")[1].text for tr in rows()}
    assert groups == {"trained_bare", "trained_skill"} and len(rows()) == 4
    box.send_keys("-nothing-like-this")
    assert rows() == [] and browser.find_element(By.ID, "explorer-empty").is_displayed()
    assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_skill_texts_in_chromium(browser, report) -> None:
    from selenium.webdriver.common.by import By

    last = json.loads(max((report.bundle / "skills").glob("round_*.json"), key=lambda p: int(p.stem[6:])).read_text(
        encoding="utf-8"))
    for lang in catalog.LANGS:
        _load(browser, report.out / page_file("results", lang))
        for c in last["chunks"]:
            article = browser.find_element(By.CSS_SELECTOR,
                                           f'article[data-round="{last["round"]}"][data-chunk="{c["id"]}"]')
            texts = {t.get_attribute("lang"): t.get_attribute("textContent")
                     for t in article.find_elements(By.CSS_SELECTOR, ".text")}
            assert texts == {"en": c["en"], "zh": c["zh"]}
