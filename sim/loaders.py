"""Loaders for the real item files, so users with the data can run the simulator on it unchanged.

Two formats, told apart by content (never by file name):

* ShopSimulator: `items_eval_train.json[.gz]`, a JSON list of products with a `title`, a `›`
  category path, per-option prices and one task each (`instructions[0]`), persona tasks carrying
  `user_persona` and `reason_key`.
* WebShop: `items_shuffle*.json`, a JSON list of products with a `name` and `"$..."` price
  strings, plus `items_human_ins.json` (`{asin: [instruction, ...]}`), one task per instruction.

Both become the simulator's `Product`/`Task` records, with the upstream bugs fixed on the way in:

* `price_upper` is the budget the instruction states, parsed deterministically ("40元左右" is
  "about 40": 44.0; "低于/以内/不超过 X 元" and "price lower than X dollars" are X). A WebShop
  instruction without a budget gets WebShop's rule (two of the next four multiples of 10 above the
  price, the larger kept) from a seeded generator, and the sentence is appended, so the text and the
  goal agree; a ShopSimulator one states none, so nothing is enforced (WebShop's 1e6).
* Every draw is seeded by `CatalogConfig.seed` and the asin, so a restart changes nothing.
* A product whose options vary the price along two or more axes has no well-defined SKU price in
  this schema; it is dropped (upstream: 695 of 23,421) and the count logged. Axes whose values all
  share one price do not vary it and keep no per-value price.
* A ranged price with no option that decides it (all WebShop ranges) is drawn once per asin, as
  WebShop does, so the listed price is the price scored.
* Goal options are mapped to their axes by matching values (exact after WebShop's normalisation,
  then fuzzy), and stored as the product's own spelling so the env and the reward match them.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json
import logging
import os
import re
import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Literal

import numpy as np
from rapidfuzz import fuzz, process

from sim.config import CatalogConfig
from sim.records import OptionValue, Product, Task
from sim.text import has_cjk, normalize

log = logging.getLogger(__name__)

Format = Literal["shopsimulator", "webshop"]
NO_BUDGET = 1e6  # WebShop's price_upper when no budget is stated
WEBSHOP_DEFAULT_PRICE = 100.0  # WebShop prices an item without `pricing` at $100
_PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # WebShop's PRICE_RANGE
_OPTION_FUZZY_MIN = 90.0
_SHOP_SUFFIXES = ("官方旗舰店", "旗舰店", "专卖店", "专营店", "企业店", "官方店", "工厂店", "直营店", "小店", "店铺", "店",
                  " official store", " flagship store", " store", " shop")


class LoaderError(ValueError):
    """A real item file is unreadable or malformed; the message names the file and the record."""


@dataclasses.dataclass
class LoadStats:
    """What loading kept, fixed and dropped; logged once, kept on the catalog for inspection."""

    records: int = 0
    products: int = 0
    tasks: int = 0
    dropped_multi_price_axes: int = 0
    dropped_duplicate_asin: int = 0
    drawn_prices: int = 0
    default_prices: int = 0
    budgets_parsed: int = 0
    budgets_drawn: int = 0
    budgets_missing: int = 0
    options_unmatched: int = 0
    products_without_task: int = 0
    instructions_unknown_asin: int = 0


class ItemCatalog:
    """A catalog loaded from a real item file: list-backed, read-only, one `Task` list."""

    def __init__(self, products: list[Product], tasks: list[Task], lang: str, *, source: str,
                 format: Format, stats: LoadStats):
        self._products = products
        self._tasks = tasks
        self._by_asin = {p.asin.lower(): i for i, p in enumerate(products)}
        self.lang = lang
        self.source = source
        self.format = format
        self.stats = stats

    def __len__(self) -> int:
        return len(self._products)

    def __getitem__(self, index: int) -> Product:
        if not 0 <= index < len(self._products):
            raise IndexError(f"product index {index} out of range [0, {len(self._products)})")
        return self._products[index]

    def __iter__(self) -> Iterator[Product]:
        return iter(self._products)

    def index_of(self, asin: str) -> int | None:
        # Clicks arrive lower-cased (WebShop's asins are upper-case), so lookup ignores case.
        return self._by_asin.get(asin.lower())

    @property
    def tasks(self) -> Sequence[Task]:
        return self._tasks


# -- entry point ---------------------------------------------------------------------------------


def load_items(config: CatalogConfig) -> ItemCatalog:
    """Loads `config.items_path` (ShopSimulator or WebShop, detected from content)."""
    path = config.items_path
    records = _read_json(path)
    if not isinstance(records, list):
        raise LoaderError(f"{path}: expected a JSON list of products, got a JSON {type(records).__name__}")
    if not records:
        raise LoaderError(f"{path}: the product list is empty")
    fmt = detect_format(path, records)
    if fmt == "shopsimulator":
        if config.instructions_path:
            raise LoaderError(
                f"{path}: a ShopSimulator items file carries its own instructions; unset "
                f"catalog.instructions_path ({config.instructions_path})"
            )
        catalog = _load_shopsimulator(path, records, config.seed)
    else:
        ins_path = config.instructions_path or _sibling(path, "items_human_ins.json")
        catalog = _load_webshop(path, records, ins_path, config.seed)
    if catalog.lang != config.lang:
        log.info("%s: language inferred from the text as %r (catalog.lang=%r is ignored for item files)",
                 path, catalog.lang, config.lang)
    s = catalog.stats
    log.info("loaded %s (%s): %s", path, fmt, dataclasses.asdict(s))
    if s.dropped_multi_price_axes:
        log.warning("%s: dropped %d products whose price varies along >= 2 option axes (no single SKU price)",
                    path, s.dropped_multi_price_axes)
    if s.dropped_duplicate_asin:
        log.warning("%s: dropped %d records repeating an earlier asin", path, s.dropped_duplicate_asin)
    if s.options_unmatched:
        log.warning("%s: %d goal options match no option value of their product and were left out",
                    path, s.options_unmatched)
    if not catalog.tasks:
        raise LoaderError(f"{path}: no tasks could be built (no product has an instruction)")
    return catalog


def detect_format(path: str, records: list[Any]) -> Format:
    first = records[0]
    if not isinstance(first, dict):
        raise LoaderError(f"{path}: record 0 is a JSON {type(first).__name__}, expected an object (a product)")
    if "title" in first or "instructions" in first or "shop_name" in first:
        return "shopsimulator"
    if "name" in first:
        return "webshop"
    raise LoaderError(
        f"{path}: record 0 is neither a ShopSimulator product (has 'title', 'instructions') nor a WebShop "
        f"one (has 'name'); its keys are {sorted(first)[:12]}"
    )


# -- ShopSimulator -------------------------------------------------------------------------------


def _load_shopsimulator(path: str, records: list[Any], seed: int) -> ItemCatalog:
    stats = LoadStats(records=len(records))
    lang = _infer_lang(r.get("title", "") for r in records[:200] if isinstance(r, dict))
    products: list[Product] = []
    tasks: list[Task] = []
    seen: set[str] = set()
    for i, rec in enumerate(records):
        where = _Where(path, i, rec)
        asin = where.asin
        if asin.lower() in seen:
            stats.dropped_duplicate_asin += 1
            continue
        seen.add(asin.lower())
        title = where.str_field("title")
        shop = where.str_field("shop_name", required=False)
        category = _split_path(where.str_field("category", required=False))
        options = _options(where, with_prices=True)
        if options is None:
            stats.dropped_multi_price_axes += 1
            continue
        pricing = _numbers(where, "pricing", where.get("pricing", required=True))
        pricing, drawn = _settle_pricing(pricing, options, seed, asin)
        stats.drawn_prices += drawn
        product = Product(
            asin=asin,
            title=title,
            brand=_brand_of(shop),
            shop=shop,
            category=category,
            attributes=_strings(where, "attribute", where.get("attribute", default=[])),
            options=options,
            pricing=pricing,
            description=where.str_field("full_description", required=False),
            bullets=_bullets(where, where.get("small_description", default=None)),
        )
        instructions = where.get("instructions", default=[])
        if not isinstance(instructions, list):
            where.fail(f"'instructions' must be a list, got {type(instructions).__name__}")
        products.append(product)
        if not instructions:
            stats.products_without_task += 1
            continue
        ins = instructions[0]
        iw = where.sub("instructions[0]", ins)
        instruction = iw.str_field("instruction")
        simple = iw.str_field("instruction_simple", required=False) or instruction
        goal_options = _goal_options(iw, product, iw.get("instruction_options", default=[]), stats)
        budget = parse_price_upper(instruction)
        if budget is None:
            stats.budgets_missing += 1
            budget = NO_BUDGET
        else:
            stats.budgets_parsed += 1
        persona = _persona(where, where.get("user_persona", default=None))
        reason_key = where.get("reason_key", default=None)
        if reason_key is not None and not isinstance(reason_key, str):
            where.fail(f"'reason_key' must be a string or null, got {type(reason_key).__name__}")
        sample = iw.get("instruction_sample", default=None)
        if persona is not None and not sample:
            # Never shipped upstream; its clients show the vague request with the profile instead.
            sample = simple
        tasks.append(Task(
            task_id=len(tasks),
            asin=asin,
            instruction=instruction,
            instruction_simple=simple,
            attributes=_strings(iw, "attributes", iw.get("attributes", default=[])),
            options=goal_options,
            price_upper=budget,
            category=category,
            title=title,
            product_type=category[-1] if category else "",
            instruction_sample=sample if persona is not None else None,
            user_persona=persona,
            reason_key=(reason_key or None) if persona is not None else None,
            hidden_aspect=_hidden_aspect(reason_key, goal_options) if persona is not None else None,
        ))
    stats.products, stats.tasks = len(products), len(tasks)
    return ItemCatalog(products, tasks, lang, source=path, format="shopsimulator", stats=stats)


def _persona(where: _Where, value: Any) -> Mapping[str, Any] | None:
    if value is None or value == "":
        return None
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            where.fail(f"'user_persona' is a string but not JSON ({e.msg})")
    if not isinstance(value, dict):
        where.fail(f"'user_persona' must be an object or null, got {type(value).__name__}")
    if not value:
        return None
    # The hidden reasoning explains the task to annotators; the agent must never see it.
    return {k: v for k, v in value.items() if k != "__reasoning__"}


def _hidden_aspect(reason_key: str | None, goal_options: Mapping[str, str]) -> str:
    """Which requirement a persona task hides, read from the profile field that holds it."""
    key = normalize(reason_key or "")
    if "价格" in key or "price" in key:
        return "price"
    for words in (("颜色", "color", "colour"), ("尺码", "尺寸", "size")):
        if any(w in key for w in words):
            for axis in goal_options:
                if any(w in normalize(axis) for w in (*words, "色" if "颜色" in words else "码")):
                    return axis
    return "attributes"


# -- WebShop -------------------------------------------------------------------------------------


def _load_webshop(path: str, records: list[Any], ins_path: str, seed: int) -> ItemCatalog:
    stats = LoadStats(records=len(records))
    if not ins_path or not os.path.exists(ins_path):
        raise LoaderError(
            f"{path} is a WebShop items file, whose tasks live in items_human_ins.json; "
            f"{'no such file: ' + ins_path if ins_path else 'none found'}: set catalog.instructions_path"
        )
    human = _read_json(ins_path)
    if not isinstance(human, dict):
        raise LoaderError(f"{ins_path}: expected a JSON object {{asin: [instruction, ...]}}, "
                          f"got a JSON {type(human).__name__}")
    lang = _infer_lang(r.get("name", "") for r in records[:200] if isinstance(r, dict))
    products: list[Product] = []
    prices: list[float] = []
    seen: dict[str, int] = {}
    for i, rec in enumerate(records):
        where = _Where(path, i, rec)
        asin = where.asin
        if asin.lower() in seen:
            stats.dropped_duplicate_asin += 1
            continue
        title = where.str_field("name")
        options = _options(where, with_prices=False)
        assert options is not None
        raw = where.get("pricing", default=None)
        if raw is None or raw == "" or raw == []:
            pricing: tuple[float, ...] = (WEBSHOP_DEFAULT_PRICE,)
            stats.default_prices += 1
        else:
            pricing = _numbers(where, "pricing", _webshop_prices(where, raw) if isinstance(raw, str) else raw)
        pricing, drawn = _settle_pricing(pricing, options, seed, asin)
        stats.drawn_prices += drawn
        category = _split_path(where.str_field("product_category", required=False))
        if not category:
            top = where.str_field("category", required=False)
            category = (top,) if top else ()
        attrs = where.get("Attributes", default=None)
        bullets = where.get("BulletPoints", default=None)
        if bullets is None:
            bullets = where.get("small_description", default=None)
        instructions = human.get(asin)
        if not isinstance(instructions, list):
            instructions = []  # a malformed entry is reported with its file when tasks are built
        attributes = _strings(where, "Attributes", attrs) if attrs is not None else ()
        if attrs is None:
            # WebShop takes `Attributes` from items_ins_v2, whose attributes the human annotators
            # chose from; without that file, the chosen ones are the best record of them.
            attributes = tuple(dict.fromkeys(
                a for ins in instructions if isinstance(ins, dict)
                for a in ins.get("instruction_attributes") or [] if isinstance(a, str)))
        seen[asin.lower()] = len(products)
        products.append(Product(
            asin=asin,
            title=title,
            brand="",
            shop="",
            category=category,
            attributes=attributes,
            options=options,
            pricing=pricing,
            description=where.str_field("full_description", required=False),
            bullets=_bullets(where, bullets),
        ))
        prices.append(pricing[0])

    tasks: list[Task] = []
    for asin, entries in human.items():
        index = seen.get(str(asin).lower())
        if not isinstance(entries, list):
            raise LoaderError(f"{ins_path}: asin {asin}: expected a list of instructions, "
                              f"got {type(entries).__name__}")
        if index is None:
            stats.instructions_unknown_asin += len(entries)
            continue
        product = products[index]
        for j, ins in enumerate(entries):
            iw = _Where(ins_path, j, ins, label=f"asin {asin}, instruction {j}")
            instruction = iw.str_field("instruction")
            raw_opts = iw.get("instruction_options", default=[])
            goal_options = _goal_options(iw, product, raw_opts, stats)
            budget = parse_price_upper(instruction)
            if budget is not None:
                stats.budgets_parsed += 1
            else:
                budget = _webshop_budget(prices[index], _rng(seed, "budget", product.asin, j))
                if budget < NO_BUDGET:
                    instruction = f"{instruction.rstrip().rstrip('.')}, and price lower than {budget:.2f} dollars"
                    stats.budgets_drawn += 1
                else:
                    stats.budgets_missing += 1
            kind = product.category[-1] if product.category else ""
            tasks.append(Task(
                task_id=len(tasks),
                asin=product.asin,
                instruction=instruction,
                # WebShop has no vague request; the multi-turn shopper opens with the product type.
                instruction_simple=f"I'm looking for {kind.lower()}." if kind else "I'm looking for something.",
                attributes=_strings(iw, "instruction_attributes", iw.get("instruction_attributes", default=[])),
                options=goal_options,
                price_upper=budget,
                category=product.category,
                title=product.title,
                product_type=kind,
            ))
    stats.products_without_task = len(products) - len({t.asin for t in tasks})
    stats.products, stats.tasks = len(products), len(tasks)
    return ItemCatalog(products, tasks, lang, source=path, format="webshop", stats=stats)


def _webshop_prices(where: _Where, text: str) -> list[float]:
    """'$12.99' -> [12.99]; '$10.00 - $20.00' -> [10.0, 20.0] (WebShop's parse, commas allowed)."""
    out = []
    for part in text.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            out.append(float(digits))
        except ValueError:
            where.fail(f"'pricing' {text!r} is not '$12.99' or '$10.00 - $20.00'")
    if not out:
        where.fail(f"'pricing' {text!r} is not '$12.99' or '$10.00 - $20.00'")
    return out


def _webshop_budget(price: float, rng: np.random.Generator) -> float:
    """WebShop's price_upper rule, seeded: two of the next four multiples of 10, the larger."""
    candidates = [p for p in _PRICE_RANGE if p > price][:4]
    if len(candidates) < 2:
        return NO_BUDGET
    picked = rng.choice(len(candidates), 2, replace=False)
    return candidates[int(picked.max())]


# -- budget parsing ------------------------------------------------------------------------------

_NUM = r"\d+(?:\.\d+)?"
_CUR = r"(?:元|块钱|块|rmb|人民币|dollars?|usd|bucks)"
_JOIN = r"(?:-|~|–|—|到|至|to)"
_MONEY_RE = re.compile(
    rf"[¥$]\s*(?P<a>{_NUM})(?:\s*{_JOIN}\s*[¥$]?\s*(?P<b>{_NUM}))?(?:\s*{_CUR})?"
    rf"|(?P<c>{_NUM})(?:\s*{_CUR}?\s*{_JOIN}\s*(?P<d>{_NUM}))?\s*{_CUR}"
)
_BETWEEN_RE = re.compile(rf"between\s*[¥$]?\s*(?P<a>{_NUM})\s*{_CUR}?\s*and\s*[¥$]?\s*(?P<b>{_NUM})")
_UPPER_BEFORE = ("低于", "不超过", "不高于", "不超", "不到", "少于", "最多", "最高", "预算", "控制在",
                 "lower than", "less than", "under", "below", "no more than", "not more than", "at most",
                 "up to", "within", "budget", "maximum", "max", "cheaper than", "not exceeding", "no higher than")
_UPPER_AFTER = ("以内", "以下", "之内", "内", "封顶", "以下的", "or less", "or under", "max", "at most")
ABOUT_FACTOR = 1.10


def parse_price_upper(instruction: str) -> float | None:
    """The budget an instruction states, or None when it states none.

    "X 元以内 / 低于 X 元 / 不超过 X 元 / price lower than X dollars / under $X" -> X;
    "X 元左右 / about $X" and a bare price -> X * 1.10 (about X leaves a little room);
    "X-Y 元 / between $X and $Y" -> Y. The first bounded mention wins, then the first other one.
    """
    text = normalize(instruction)
    candidates: list[tuple[int, float]] = []  # (rank: 0 bound, 1 about/bare), value
    for m in _BETWEEN_RE.finditer(text):
        candidates.append((0, float(m.group("b"))))
    for m in _MONEY_RE.finditer(text):
        lo = m.group("a") or m.group("c")
        hi = m.group("b") or m.group("d")
        before = text[max(0, m.start() - 18) : m.start()]
        after = text[m.end() : m.end() + 8]
        if any(w in before for w in _UPPER_BEFORE) or any(after.lstrip().startswith(w) for w in _UPPER_AFTER):
            candidates.append((0, float(hi or lo)))
        elif hi is not None:
            candidates.append((0, float(hi)))
        else:
            candidates.append((1, round(float(lo) * ABOUT_FACTOR, 2)))
    if not candidates:
        return None
    return min(candidates, key=lambda c: c[0])[1]


# -- shared field handling -----------------------------------------------------------------------


class _Where:
    """A record being read: typed field access whose errors name the file and the record."""

    def __init__(self, path: str, index: int, rec: Any, label: str | None = None):
        self.path, self.index, self.rec = path, index, rec
        self.label = label or f"record {index}"
        if not isinstance(rec, dict):
            self.fail(f"expected a JSON object, got {type(rec).__name__}")

    @property
    def asin(self) -> str:
        asin = self.get("asin", required=True)
        if not isinstance(asin, (str, int)) or isinstance(asin, bool) or not str(asin).strip():
            self.fail(f"'asin' must be a non-empty string, got {asin!r}")
        return str(asin).strip()

    def sub(self, name: str, rec: Any) -> _Where:
        return _Where(self.path, self.index, rec, label=f"{self._name()}, {name}")

    def _name(self) -> str:
        asin = self.rec.get("asin") if isinstance(self.rec, dict) else None
        return f"{self.label} (asin {asin})" if asin is not None and "asin" not in self.label else self.label

    def fail(self, what: str) -> None:
        raise LoaderError(f"{self.path}: {self._name()}: {what}")

    def get(self, key: str, *, required: bool = False, default: Any = None) -> Any:
        if key in self.rec:
            return self.rec[key]
        if required:
            self.fail(f"missing required field '{key}'")
        return default

    def str_field(self, key: str, *, required: bool = True) -> str:
        value = self.get(key, required=required, default="")
        if value is None and not required:
            return ""
        if not isinstance(value, str):
            self.fail(f"'{key}' must be a string, got {type(value).__name__}")
        if required and not value.strip():
            self.fail(f"'{key}' is empty")
        return value.strip()


def _option_value(text: str) -> str:
    """WebShop's option normalisation (ShopSimulator's values are already in this form)."""
    return text.strip().replace("/", " | ").lower()


def _options(where: _Where, *, with_prices: bool) -> dict[str, tuple[OptionValue, ...]] | None:
    """Option axes in file order; None when two or more axes vary the price (the drop rule)."""
    raw = where.get("customization_options", default=None)
    if raw is None or raw == [] or raw == "":
        return {}
    if not isinstance(raw, dict):
        where.fail(f"'customization_options' must be an object {{axis: [values]}}, got {type(raw).__name__}")
    axes: dict[str, list[tuple[str, float | None]]] = {}
    for axis, values in raw.items():
        if values is None:
            continue
        if not isinstance(values, list):
            where.fail(f"customization_options[{axis!r}] must be a list, got {type(values).__name__}")
        out: list[tuple[str, float | None]] = []
        for k, v in enumerate(values):
            if not isinstance(v, dict) or not isinstance(v.get("value"), str):
                where.fail(f"customization_options[{axis!r}][{k}] must be an object with a string 'value'")
            price = None
            if with_prices and v.get("price") not in (None, ""):
                price = _number(where, f"customization_options[{axis!r}][{k}].price", v["price"])
            value = _option_value(v["value"])
            if value and value not in (x for x, _ in out):
                out.append((value, price))
        if out:
            axes[str(axis).strip()] = out
    varying = [a for a, vals in axes.items() if len({p for _, p in vals}) > 1]
    if len(varying) >= 2:
        return None
    return {
        axis: tuple(OptionValue(value, price if axis in varying else None) for value, price in vals)
        for axis, vals in axes.items()
    }


def _settle_pricing(pricing: tuple[float, ...], options: Mapping[str, tuple[OptionValue, ...]],
                    seed: int, asin: str) -> tuple[tuple[float, ...], int]:
    """The listed price, consistent with the SKU prices; returns (pricing, 1 if drawn else 0)."""
    priced = [v.price for values in options.values() for v in values if v.price is not None]
    if priced:
        return (min(priced), max(priced)), 0
    if len(pricing) == 1 or min(pricing) == max(pricing):
        return (pricing[0],), 0
    # No option decides a ranged price: draw it once per asin (WebShop's uniform(min, max)).
    lo, hi = min(pricing), max(pricing)
    return (round(float(_rng(seed, "price", asin).uniform(lo, hi)), 2),), 1


def _goal_options(where: _Where, product: Product, raw: Any, stats: LoadStats) -> dict[str, str]:
    """Maps goal option values to their axes by matching the product's own values."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        wanted = list(raw.items())
    elif isinstance(raw, list):
        wanted = [(None, v) for v in raw]
    else:
        where.fail(f"'instruction_options' must be a list (or an axis -> value object), got {type(raw).__name__}")
    goal: dict[str, str] = {}
    for hint, value in wanted:
        if not isinstance(value, str):
            where.fail(f"instruction option {value!r} must be a string")
        match = _match_option(product, _option_value(value), hint, taken=goal)
        if match is None:
            stats.options_unmatched += 1
            continue
        goal[match[0]] = match[1]
    return goal


def _match_option(product: Product, want: str, hint: str | None, taken: Mapping[str, str]) -> tuple[str, str] | None:
    free = [(axis, v.value) for axis, values in product.options.items() if axis not in taken for v in values]
    if hint is not None:
        same = [(a, v) for a, v in free if normalize(a) == normalize(str(hint))]
        free = same + [x for x in free if x not in same]
    for axis, value in free:
        if normalize(value) == normalize(want):
            return axis, value
    if not free or not want:
        return None
    best = process.extractOne(normalize(want), [normalize(v) for _, v in free], scorer=fuzz.ratio)
    if best is not None and best[1] >= _OPTION_FUZZY_MIN:
        return free[best[2]]
    return None


def _number(where: _Where, name: str, value: Any) -> float:
    if isinstance(value, bool):
        where.fail(f"'{name}' must be a number, got {value!r}")
    if isinstance(value, (int, float)):
        x = float(value)
    elif isinstance(value, str):
        try:
            x = float(value.replace(",", "").replace("¥", "").replace("$", "").strip())
        except ValueError:
            where.fail(f"'{name}' must be a number, got {value!r}")
    else:
        where.fail(f"'{name}' must be a number, got {type(value).__name__}")
    if not np.isfinite(x) or x < 0:
        where.fail(f"'{name}' must be a finite price >= 0, got {value!r}")
    return x


def _numbers(where: _Where, name: str, value: Any) -> tuple[float, ...]:
    if not isinstance(value, list):
        value = [value]
    if not 1 <= len(value) <= 2:
        where.fail(f"'{name}' must be [price] or [min, max], got {value!r}")
    return tuple(_number(where, name, v) for v in value)


def _strings(where: _Where, name: str, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        where.fail(f"'{name}' must be a list of strings, got {value!r:.80}")
    return tuple(v.strip() for v in value if v.strip())


def _bullets(where: _Where, value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value.strip(),) if value.strip() else ()
    return _strings(where, "small_description", value)


def _split_path(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split("›") if part.strip())


def _brand_of(shop: str) -> str:
    """The brand a shop name carries ('塔拉蕾官方旗舰店' -> '塔拉蕾'); '' when it names none."""
    low = shop.lower()
    for suffix in _SHOP_SUFFIXES:
        if low.endswith(suffix) and len(shop) > len(suffix):
            return shop[: len(shop) - len(suffix)].strip()
    return ""


def _infer_lang(texts: Any) -> str:
    return "zh" if any(has_cjk(t) for t in texts if isinstance(t, str)) else "en"


def _rng(seed: int, *keys: Any) -> np.random.Generator:
    """A generator fixed by the seed and the keys (a stable hash, unlike Python's salted one)."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return np.random.default_rng([seed, int.from_bytes(digest, "little")])


def _sibling(path: str, name: str) -> str:
    candidate = os.path.join(os.path.dirname(os.path.abspath(path)), name)
    return candidate if os.path.exists(candidate) else ""


def _read_json(path: str) -> Any:
    """Reads a JSON file, gzip-compressed or not (told by its magic bytes, not its name)."""
    if not path:
        raise LoaderError("no item file given: set catalog.items_path")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise LoaderError(f"{path}: cannot read the item file ({e.strerror or e}); check catalog.items_path") from e
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except (EOFError, OSError, zlib.error) as e:
            raise LoaderError(f"{path}: truncated or corrupt gzip file ({e}); download it again") from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise LoaderError(f"{path}: not UTF-8 text (byte {e.start}); is this the item file?") from e
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise LoaderError(
            f"{path}: not valid JSON at line {e.lineno}, column {e.colno} ({e.msg}), "
            f"in or after record {_records_before(text, e.pos)}"
        ) from e


def _records_before(text: str, pos: int) -> int:
    """Index of the top-level record that holds `pos` (brace depth count, strings skipped)."""
    depth = count = 0
    in_str = escaped = False
    for ch in text[:pos]:
        if in_str:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_str = False
        elif ch == '"':
            in_str = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 1 and ch == "}":
                count += 1
    return count
