"""The static site: offline, every number equal to the bundle's figures, texts of every round.

The browser test loads each page in Debian's headless chromium (selenium), reads the console,
checks images loaded, and compares every marked number in the live DOM (including those the
behaviour explorer renders with JavaScript, before and after filtering) with figures.json.
"""

from __future__ import annotations

import html
import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from intraskill_jax.analysis.site import PAGES, fmt_value, pointer, resolve
from tests.analysis.site_check import assert_shown_equals_figure


class _Numbers(HTMLParser):
    """Collects (pointer, format, text) of every data-fig element and every src/href."""

    def __init__(self) -> None:
        super().__init__()
        self.numbers: list[tuple[str, str, str]] = []
        self.links: list[str] = []
        self._open: list[tuple[str, str] | None] = []
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        a = dict(attrs)
        self.links += [a[k] for k in ("src", "href") if k in a]
        if "data-fig" in a:
            self._open.append((a["data-fig"], a["data-fmt"]))
            self._text = []

    def handle_data(self, data: str) -> None:
        self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._open:
            ptr, fmt = self._open.pop()
            self.numbers.append((ptr, fmt, "".join(self._text)))


def test_fmt_and_pointer() -> None:
    assert fmt_value(0.7251, "pct1") == "72.5%" and fmt_value(None, "f3") == "–"
    assert fmt_value(0.05, "+f3") == "+0.050" and fmt_value(3, "int") == "3"
    assert pointer("training", "final", "train/pg_loss", "raw") == "/training/final/train~1pg_loss/raw"
    assert resolve({"a/b": [1, {"c~": 2}]}, "/a~1b/1/c~0") == 2


def test_number_check_catches_wrong_values() -> None:
    figures = {"x": 0.5, "k": 3, "none": None}
    assert_shown_equals_figure(figures, "/x", "pct1", "50.0%")
    for ptr, fmt, text in (("/x", "f3", "0.600"), ("/x", "f3", "0.50"), ("/x", "+f3", "0.500"),
                           ("/k", "int", "4"), ("/none", "f2", "0.00"), ("/x", "g4", "0.5001")):
        with pytest.raises(AssertionError):
            assert_shown_equals_figure(figures, ptr, fmt, text)


def test_static_pages_are_offline_and_numbers_match(report, figures: dict) -> None:
    site = report.out
    seen = 0
    for name, _ in PAGES:
        text = (site / name).read_text(encoding="utf-8")
        parser = _Numbers()
        parser.feed(text)
        for link in parser.links:
            assert not re.match(r"^(https?:)?//", link), f"{name} links outside: {link}"
            if not link.startswith(("data:", "#")):
                assert (site / link).is_file(), f"{name}: {link} is not in the site"
        for ptr, fmt, shown in parser.numbers:
            assert_shown_equals_figure(figures, ptr, fmt, shown)
        seen += len(parser.numbers)
    for path in [*site.glob("*.html"), *site.glob("assets/*")]:
        assert "http://" not in path.read_text() and "https://" not in path.read_text(), path
    assert seen > 200
    results = (site / "results.html").read_text()
    assert 'data-fig="/comparisons/0/mcnemar_p"' in results
    assert 'data-fig="/conditions/3/success"' in results


def test_overview_leads_with_the_summarys_headline(report, run_dir: Path, figures: dict) -> None:
    from intraskill_jax.analysis.summary import format_summary

    page = (report.out / "index.html").read_text(encoding="utf-8")
    order = ["<h2>Test conditions</h2>", "<h2>Paired differences</h2>", "<h2>Skill bank by round</h2>",
             "<h2>Training funnel</h2>", "<h2>Run</h2>", "Last value of each metric"]
    at = [page.index(h) for h in order]
    assert at == sorted(at) and page.index("<h2>") == at[0]
    parser = _Numbers()
    parser.feed(page)
    shown = {ptr: text for ptr, _, text in parser.numbers}
    for i in range(4):
        for outcome in ("reward", "strict", "success"):
            assert f"/conditions/{i}/{outcome}" in shown
    for outcome in ("reward", "strict", "success"):
        assert {f"/comparisons/0/{outcome}_{k}" for k in ("diff", "ci_low", "ci_high")} <= set(shown)
    assert "/rounds/1/n_retain" in shown and "/training_funnel/episodes_admitted" in shown
    assert "reward (loose) diff [95% CI]" in page
    # The terminal prints what the page shows.
    summary = format_summary(run_dir)
    c = figures["conditions"][3]
    row = next(line for line in summary.splitlines() if line.startswith(c["condition"] + " "))
    assert row.split()[-3:] == [shown["/conditions/3/reward"], shown["/conditions/3/strict"],
                                shown["/conditions/3/success"]]
    assert (f'{shown["/comparisons/0/reward_diff"]} [{shown["/comparisons/0/reward_ci_low"]}, '
            f'{shown["/comparisons/0/reward_ci_high"]}]') in summary


def test_skill_texts_of_every_round(report) -> None:
    page = (report.out / "skills.html").read_text(encoding="utf-8")
    for p in sorted((report.bundle / "skills").glob("round_*.json")):
        s = json.loads(p.read_text(encoding="utf-8"))
        for c in s["chunks"]:
            article = re.search(
                rf'<article class="chunk [a-z]+" data-round="{s["round"]}" data-chunk="{c["id"]}">(.*?)</article>',
                page,
                re.S,
            )
            assert article, (s["round"], c["id"])
            assert f'data-lang="en">{html.escape(c["en"])}</div>' in article.group(1)
            assert f'data-lang="zh">{html.escape(c["zh"])}</div>' in article.group(1)


# -- in a real browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    chromium, driver_bin = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver_bin):
        pytest.skip(
            "chromium and chromedriver are not installed: apt-get install -y chromium "
            "chromium-driver (.ci/run installs them when it runs as root)"
        )
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the [test] extra")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,1600"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(driver_bin), options=options)
    yield driver
    driver.quit()


_NUMBERS_JS = (
    "return Array.from(document.querySelectorAll('[data-fig]'))"
    ".map(e => [e.dataset.fig, e.dataset.fmt, e.textContent]);"
)


def _load(browser, page: Path) -> list[list[str]]:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(page.resolve().as_uri())
    # get() may return before a file:// page finishes on a busy machine: wait for the load event.
    WebDriverWait(browser, 30).until(
        lambda d: d.execute_script("return document.readyState") == "complete"
    )
    errors = [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "ERROR")]
    assert not errors, f"{page.name}: console errors {errors}"
    broken = browser.execute_script(
        "return Array.from(document.images).filter(i => !(i.complete && i.naturalWidth > 0))"
        ".map(i => i.src);"
    )
    assert not broken, f"{page.name}: images that did not load: {broken}"
    return browser.execute_script(_NUMBERS_JS)


def test_pages_in_chromium(browser, report, figures: dict) -> None:
    for name, title in PAGES:
        numbers = _load(browser, report.out / name)
        assert title in browser.title
        assert numbers, name
        for ptr, fmt, text in numbers:
            assert_shown_equals_figure(figures, ptr, fmt, text)
        # Every page links to every other page, and each link resolves to a page of the site.
        hrefs = browser.execute_script("return Array.from(document.querySelectorAll('header nav a')).map(a => a.href)")
        assert [h.rsplit("/", 1)[1] for h in hrefs] == [p for p, _ in PAGES]


def test_behaviour_explorer_filters_in_chromium(browser, report, figures: dict) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    _load(browser, report.out / "behaviour.html")
    beh = figures["behaviour"]
    rows = lambda: browser.find_elements(By.CSS_SELECTOR, "#explorer tbody tr")  # noqa: E731
    n_all = sum(r["outcome"] == "all" for key in beh for r in beh[key])
    assert len(rows()) == n_all

    Select(browser.find_element(By.ID, "f-outcome")).select_by_value("failure")
    Select(browser.find_element(By.ID, "f-source")).select_by_value("validation")
    shown = rows()
    assert len(shown) == sum(r["outcome"] == "failure" for r in beh["by_checkpoint"])
    assert {(tr.get_attribute("data-source"), tr.get_attribute("data-outcome")) for tr in shown} == {
        ("validation", "failure")
    }
    for ptr, fmt, text in browser.execute_script(_NUMBERS_JS):
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

    _load(browser, report.out / "skills.html")
    last = json.loads(max((report.bundle / "skills").glob("round_*.json"), key=lambda p: int(p.stem[6:])).read_text(
        encoding="utf-8"))
    for c in last["chunks"]:
        article = browser.find_element(By.CSS_SELECTOR,
                                       f'article[data-round="{last["round"]}"][data-chunk="{c["id"]}"]')
        texts = {t.get_attribute("lang"): t.get_attribute("textContent")
                 for t in article.find_elements(By.CSS_SELECTOR, ".text")}
        assert texts == {"en": c["en"], "zh": c["zh"]}
