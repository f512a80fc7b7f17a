"""Seeded synthetic catalog and tasks, generated on demand.

Products live in sub-categories of `products_per_subcategory` near-identical items (same type and
variant; different brand, shop, material, style, features, options and prices). Product `i` is a
pure function of `(seed, i)`: a sub-category is regenerated in one vectorised draw when first
touched and kept in a bounded LRU, so a 1M-product catalog holds no per-product Python objects
beyond what is cached, and streaming the whole catalog for indexing is one pass.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import threading
from collections.abc import Iterator, Sequence

import numpy as np

from sim import persona
from sim.config import CatalogConfig
from sim.records import OptionValue, Product, Task
from sim.vocab import BRAND_CHARS_ZH, BRAND_SYLLABLES_EN, DOMAINS, MODIFIERS, NUM_TYPES, STYLES, Domain, Word, words

_ASIN_MUL = 7_919_826_351  # odd and not a multiple of 5: coprime with every 10**k, so asin <-> index is a bijection
_SHOP_SUFFIXES = words("official store|官方旗舰店, flagship store|专卖店, outlet|折扣店, home store|生活馆")
_NUM_BRANDS = 16
_TYPE_INDEX = [(d, t) for d, dom in enumerate(DOMAINS) for t in range(len(dom.types))]
assert len(_TYPE_INDEX) == NUM_TYPES


@dataclasses.dataclass(frozen=True)
class Subcategory:
    index: int
    domain: Domain
    type: Word
    modifier: Word
    series: int

    def name(self, lang: str) -> str:
        sep = " " if lang == "en" else ""
        base = f"{self.modifier(lang)}{sep}{self.type(lang)}"
        if self.series:
            base += f" gen {self.series + 1}" if lang == "en" else f"{self.series + 1}代"
        return base

    def path(self, lang: str) -> tuple[str, ...]:
        d = self.domain
        return (d.name(lang), d.group(lang), self.type(lang), self.name(lang))


def _brands(domain_index: int, lang: str) -> list[str]:
    """16 fixed brand names per domain (independent of the seed, like real brands)."""
    rng = np.random.default_rng([0xB7A2D, domain_index])
    names: list[str] = []
    while len(names) < _NUM_BRANDS:
        if lang == "en":
            a, b = rng.choice(len(BRAND_SYLLABLES_EN), 2, replace=False)
            name = (BRAND_SYLLABLES_EN[a] + BRAND_SYLLABLES_EN[b]).capitalize()
        else:
            a, b = rng.choice(len(BRAND_CHARS_ZH), 2, replace=False)
            name = BRAND_CHARS_ZH[a] + BRAND_CHARS_ZH[b]
        if name not in names:
            names.append(name)
    return names


def _round_price(x: float) -> float:
    return round(x, 1) if x < 10 else float(math.floor(x)) + 0.9


def _nice_ceil(x: float) -> float:
    step = 1 if x < 20 else 5 if x < 200 else 10 if x < 1000 else 50
    return float(math.ceil(x / step) * step)


class SyntheticCatalog:
    """The default catalog: `catalog[i]` is a Product, `catalog.tasks[i]` its Task."""

    def __init__(self, config: CatalogConfig, *, cache_subcategories: int = 1024):
        self.config = config
        self.lang = config.lang
        self.per = config.products_per_subcategory
        self.num_subcategories = math.ceil(config.num_products / self.per)
        # Ids are "1" followed by id_digits-1 digits: a bijective affine map of the index mod 10**(id_digits-1).
        self._asin_mod = 10 ** (config.id_digits - 1)
        self._asin_mul = _ASIN_MUL % self._asin_mod
        self._asin_mul_inv = pow(self._asin_mul, -1, self._asin_mod)
        self._asin_add = (config.seed * 2_654_435_761 + 987_654_321) % self._asin_mod
        self._cache: collections.OrderedDict[int, list[Product]] = collections.OrderedDict()
        self._cache_size = cache_subcategories
        self._lock = threading.Lock()
        self._brands = [_brands(d, self.lang) for d in range(len(DOMAINS))]
        self.tasks: Sequence[Task] = _Tasks(self)
        # Resets rebuild the same tasks again and again (groups of siblings, validation rounds).
        self.make_task = functools.lru_cache(maxsize=8192)(self.make_task)  # type: ignore[method-assign]

    # -- products ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return self.config.num_products

    def __getitem__(self, index: int) -> Product:
        if not 0 <= index < len(self):
            raise IndexError(f"product index {index} out of range [0, {len(self)})")
        sub, j = divmod(index, self.per)
        return self.products_of(sub)[j]

    def __iter__(self) -> Iterator[Product]:
        """Streams every product once without filling the cache (one sub-category at a time)."""
        for s in range(self.num_subcategories):
            yield from self._generate(s)

    def asin(self, index: int) -> str:
        return str(self._asin_mod + (index * self._asin_mul + self._asin_add) % self._asin_mod)

    def index_of(self, asin: str) -> int | None:
        if len(asin) != self.config.id_digits or not asin.isdigit() or asin[0] != "1":
            return None
        index = ((int(asin) - self._asin_mod - self._asin_add) * self._asin_mul_inv) % self._asin_mod
        return index if index < len(self) else None

    def subcategory(self, s: int) -> Subcategory:
        d, t = _TYPE_INDEX[s % NUM_TYPES]
        rounds = s // NUM_TYPES
        modifier = MODIFIERS[(rounds + 7 * s) % len(MODIFIERS)]
        return Subcategory(s, DOMAINS[d], DOMAINS[d].types[t], modifier, rounds // len(MODIFIERS))

    def products_of(self, s: int) -> list[Product]:
        with self._lock:
            hit = self._cache.get(s)
            if hit is not None:
                self._cache.move_to_end(s)
                return hit
        products = self._generate(s)
        with self._lock:
            self._cache[s] = products
            while len(self._cache) > self._cache_size:
                self._cache.popitem(last=False)
        return products

    def _generate(self, s: int) -> list[Product]:
        lang, sub = self.lang, self.subcategory(s)
        dom = sub.domain
        d_index = DOMAINS.index(dom)
        first = s * self.per
        n = min(self.per, len(self) - first)
        rng = np.random.default_rng([self.config.seed, 1, s])
        lo, hi = dom.price_range
        sub_base = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        # Each sub-category draws from a narrow slice of its domain's vocabulary, so siblings share
        # most words and a request matches many of them: telling them apart takes evidence.
        materials = rng.choice(len(dom.materials), 2, replace=False)
        styles = rng.choice(len(STYLES), 3, replace=False)
        features = rng.choice(len(dom.features), 5, replace=False)
        brand_i = rng.integers(_NUM_BRANDS, size=n)
        shop_i = rng.integers(len(_SHOP_SUFFIXES), size=n)
        material_i = materials[rng.integers(len(materials), size=n)]
        style_i = styles[rng.integers(len(styles), size=n)]
        feature_i = features[np.argsort(rng.random((n, len(features))), axis=1)[:, :3]]
        look_perm = np.argsort(rng.random((n, len(dom.looks))), axis=1)
        n_looks = rng.choice([0, 2, 3, 4, 5], size=n, p=[0.12, 0.3, 0.28, 0.18, 0.12])
        n_sizes = rng.choice([0, 2, 3, 4], size=n, p=[0.15, 0.3, 0.35, 0.2])
        size_start = rng.random(n)
        base = sub_base * rng.uniform(0.6, 1.6, size=n)
        step = rng.uniform(0.15, 0.45, size=n)
        category = sub.path(lang)
        kind = sub.name(lang)
        out = []
        for j in range(n):
            brand = self._brands[d_index][brand_i[j]]
            shop = f"{brand} {_SHOP_SUFFIXES[shop_i[j]].en}" if lang == "en" else brand + _SHOP_SUFFIXES[shop_i[j]].zh
            material = dom.materials[material_i[j]](lang)
            style = STYLES[style_i[j]](lang)
            feats = [dom.features[k](lang) for k in feature_i[j]]
            options: dict[str, tuple[OptionValue, ...]] = {}
            if n_looks[j]:
                looks = sorted(look_perm[j, : n_looks[j]])
                options[dom.look_axis(lang)] = tuple(OptionValue(dom.looks[k](lang).lower()) for k in looks)
            if n_sizes[j]:
                k0 = int(size_start[j] * (len(dom.sizes) - n_sizes[j] + 1))
                options[dom.size_axis(lang)] = tuple(
                    OptionValue(dom.sizes[k](lang).lower(), _round_price(base[j] * (1 + step[j]) ** (k - k0)))
                    for k in range(k0, k0 + n_sizes[j])
                )
                prices = [v.price for v in options[dom.size_axis(lang)]]
                pricing: tuple[float, ...] = (min(prices), max(prices))
            else:
                pricing = (_round_price(base[j]),)
            if lang == "en":
                title = f"{brand} {style} {material} {kind} - {feats[0]}, {feats[1]}"
                description = f"{title}. A {style} {kind} made of {material}."
                bullets = (f"material: {material}", f"style: {style}", *(f"feature: {f}" for f in feats))
            else:
                title = f"{brand}{style}{material}{kind}{feats[0]}{feats[1]}"
                description = f"{title}。{style}风格，{material}材质。"
                bullets = (f"材质：{material}", f"风格：{style}", *(f"特点：{f}" for f in feats))
            out.append(
                Product(
                    asin=self.asin(first + j),
                    title=title,
                    brand=brand,
                    shop=shop,
                    category=category,
                    attributes=(material, style, *feats),
                    options=options,
                    pricing=pricing,
                    description=description,
                    bullets=bullets,
                )
            )
        return out

    # -- tasks -------------------------------------------------------------------------------

    def make_task(self, index: int) -> Task:
        """The task written for product `index` (one task per product, as in the released data)."""
        product = self[index]
        sub = self.subcategory(index // self.per)
        lang, dom = self.lang, sub.domain
        rng = np.random.default_rng([self.config.seed, 2, index])
        material, style, *feats = product.attributes
        n_att = int(rng.integers(2, 5))
        chosen = sorted(rng.choice(len(product.attributes), n_att, replace=False))
        attributes = tuple(product.attributes[k] for k in chosen)
        goal_options = {axis: values[int(rng.integers(len(values)))].value for axis, values in product.options.items()}
        price = product.sku_price(goal_options)
        assert price is not None
        price_upper = _nice_ceil(price * rng.uniform(1.0, 1.2))
        kind = sub.name(lang)

        hidden_aspect = None
        hidden_attr = None
        is_persona = rng.random() < self.config.persona_fraction
        if is_persona:
            aspects = ["attributes", "price", *goal_options]
            hidden_aspect = aspects[int(rng.integers(len(aspects)))]
            if hidden_aspect == "attributes":
                hidden_attr = attributes[int(rng.integers(len(attributes)))]

        def sentence(skip: str | None) -> str:
            atts = [a for a in attributes if not (skip == "attributes" and a == hidden_attr)]
            opts = {a: v for a, v in goal_options.items() if a != skip}
            with_price = skip != "price"
            if lang == "en":
                parts = [f"i'm looking for a {kind}"]
                if atts:
                    parts.append("that is " + " and ".join(atts))
                if opts:
                    parts.append("with " + " and ".join(f"{a}: {v}" for a, v in opts.items()))
                text = ", ".join(parts)
                if with_price:
                    text += f", and price lower than {price_upper:.2f} dollars"
                return text[0].upper() + text[1:] + "."
            parts = [f"我想买一款{kind}", "要求" + "、".join(atts)] if atts else [f"我想买一款{kind}"]
            parts += [f"{a}选{v}" for a, v in opts.items()]
            if with_price:
                parts.append(f"价格在{price_upper:.2f}元以内")
            return "，".join(parts) + "。"

        instruction = sentence(None)
        simple = f"I want to buy a {sub.type(lang)}." if lang == "en" else f"我想买个{sub.type(lang)}。"
        user_persona = reason = sample = None
        if is_persona:
            assert hidden_aspect is not None
            sample = sentence(hidden_aspect)
            path, value = self._hidden_field(hidden_aspect, hidden_attr, material, style, goal_options,
                                             price_upper, dom, kind)
            reason = persona.reason_key(lang, *path)
            user_persona = persona.make_profile(
                rng, lang,
                product_type=kind,
                category=product.category[2],
                brand=product.brand,
                shop=product.shop,
                hidden_path=path,
                hidden_value=value,
                filler={
                    "function": [f(lang) for f in dom.features],
                    "material": [m(lang) for m in dom.materials],
                    "size": [s(lang).lower() for s in dom.sizes],
                },
            )
        return Task(
            task_id=index,
            asin=product.asin,
            instruction=instruction,
            instruction_simple=simple,
            attributes=attributes,
            options=goal_options,
            price_upper=price_upper,
            category=product.category,
            title=product.title,
            product_type=kind,
            instruction_sample=sample,
            user_persona=user_persona,
            reason_key=reason,
            hidden_aspect=hidden_aspect,
            hidden_value=(
                None if hidden_aspect is None
                else hidden_attr if hidden_aspect == "attributes"
                else f"{price_upper:.2f}" if hidden_aspect == "price"
                else goal_options[hidden_aspect]
            ),
        )

    def _hidden_field(self, aspect, attr, material, style, goal_options, price_upper, dom, kind):
        """Where a persona's hidden requirement lives, and the value stored there."""
        lang = self.lang
        if aspect == "price":
            return ("interests", "attrs", "price_range"), {
                persona.K["min"](lang): 0.0, persona.K["max"](lang): price_upper}
        if aspect == "attributes":
            if attr == material:
                return ("interests", "attrs", "material"), [attr]
            if attr == style:
                return ("interests", "attrs", "style"), [attr]
            sep = " " if lang == "en" else ""
            return ("behaviour", "searches"), [f"{attr}{sep}{kind}"]
        value = goal_options[aspect]
        if aspect == dom.look_axis(lang) and dom.look_axis.en == "color":
            return ("interests", "attrs", "color"), [value]
        if aspect == dom.size_axis(lang):
            return ("interests", "attrs", "size"), value
        sep = " " if lang == "en" else ""
        return ("behaviour", "searches"), [f"{value}{sep}{kind}"]


class _Tasks(Sequence[Task]):
    def __init__(self, catalog: SyntheticCatalog):
        self._catalog = catalog

    def __len__(self) -> int:
        return len(self._catalog)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if not 0 <= i < len(self):
            raise IndexError(f"task id {i} out of range [0, {len(self)})")
        return self._catalog.make_task(i)
