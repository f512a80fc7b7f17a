import re

import numpy as np
import pytest

from sim import persona
from sim.catalog import SyntheticCatalog
from sim.config import CatalogConfig
from sim.vocab import DOMAINS


def _catalog(**kw) -> SyntheticCatalog:
    return SyntheticCatalog(CatalogConfig(**{"num_products": 2400, **kw}))


def test_same_seed_same_catalog_and_tasks_different_seed_differs():
    a, b, c = _catalog(seed=3), _catalog(seed=3), _catalog(seed=4)
    for i in (0, 119, 120, 2399):
        assert a[i] == b[i]
        assert a.tasks[i] == b.tasks[i]
    assert [a[i].title for i in range(0, 2400, 97)] != [c[i].title for i in range(0, 2400, 97)]


def test_on_demand_access_equals_streaming_and_cache_is_bounded():
    cat = SyntheticCatalog(CatalogConfig(num_products=2400), cache_subcategories=3)
    streamed = list(cat)
    assert len(streamed) == len(cat) == 2400
    for i in np.random.default_rng(0).integers(0, 2400, 50):
        assert cat[int(i)] == streamed[int(i)]
    assert len(cat._cache) <= 3


def test_million_product_catalog_is_lazy():
    cat = SyntheticCatalog(CatalogConfig(num_products=1_000_000), cache_subcategories=8)
    last = cat[999_999]
    assert cat.index_of(last.asin) == 999_999
    assert cat.tasks[999_999].asin == last.asin
    assert len(cat._cache) <= 8


@pytest.mark.parametrize("digits, n", [(12, 2400), (5, 10_000), (4, 1000)])
def test_asin_is_a_bijection_and_rejects_foreign_ids(digits, n):
    cat = _catalog(id_digits=digits, num_products=n)
    asins = [cat.asin(i) for i in range(len(cat))]
    assert len(set(asins)) == len(asins)
    assert all(len(a) == digits and a.isdigit() and a[0] == "1" for a in asins)
    assert all(cat.index_of(a) == i for i, a in enumerate(asins))
    for bad in ("", "abc", "0" * digits, "1" * (digits + 1), "1" * 12 if digits != 12 else "1" * 11, "buy now"):
        assert cat.index_of(bad) is None
    assert sorted(asins) != asins  # scattered, not the index in disguise


def test_id_digits_must_hold_the_catalog():
    from sim.config import ConfigError

    with pytest.raises(ConfigError, match="id_digits"):
        CatalogConfig(num_products=1001, id_digits=4)


def test_twelve_domains_and_near_identical_subcategories():
    cat = SyntheticCatalog(CatalogConfig(num_products=120 * 96))
    domains = {cat[i].category[0] for i in range(0, len(cat), 120)}
    assert len(domains) == len(DOMAINS) == 12
    group = [cat[i] for i in range(120, 240)]
    assert len({p.category for p in group}) == 1  # one sub-category
    assert len({p.title for p in group}) > 60  # yet the items differ
    assert len({m for p in group for m in p.attributes[:1]}) <= 2  # and share a narrow vocabulary


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_task_price_upper_is_the_budget_stated_in_the_instruction(lang):
    cat = _catalog(lang=lang)
    for i in range(0, 2400, 37):
        task = cat.tasks[i]
        stated = re.findall(r"(\d+\.\d\d) (?:dollars)|(\d+\.\d\d)元", task.instruction)
        assert len(stated) == 1, task.instruction
        assert float(next(s for s in stated[0] if s)) == task.price_upper
        target = cat[i]
        assert task.asin == target.asin
        assert set(task.attributes) <= set(target.attributes)
        assert all(any(o.value == v for o in target.options[a]) for a, v in task.options.items())
        assert target.sku_price(task.options) <= task.price_upper


def test_options_have_at_most_one_price_axis_and_ranged_pricing_matches():
    cat = _catalog()
    for p in cat:
        priced = [a for a, vs in p.options.items() if any(v.price is not None for v in vs)]
        assert len(priced) <= 1
        if priced:
            prices = [v.price for v in p.options[priced[0]]]
            assert p.pricing == (min(prices), max(prices))


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_persona_tasks_hide_one_requirement_in_the_reason_key_field(lang):
    cat = _catalog(lang=lang, persona_fraction=1.0)
    kinds = set()
    for i in range(0, 2400, 41):
        task = cat.tasks[i]
        assert task.is_persona and task.reason_key and task.instruction_sample
        kinds.add(task.hidden_aspect)
        node = task.user_persona
        for key in task.reason_key.split("-"):
            node = node[key]
        if task.hidden_aspect == "price":
            assert node[persona.K["max"](lang)] == task.price_upper
            assert "dollars" not in task.instruction_sample and "元以内" not in task.instruction_sample
        else:
            assert task.hidden_value in str(node)
            assert task.instruction_sample != task.instruction
    assert {"price", "attributes"} <= kinds and len(kinds) >= 3


def test_persona_fraction_zero_means_no_profiles():
    cat = _catalog(persona_fraction=0.0)
    assert not any(cat.tasks[i].is_persona for i in range(0, 2400, 13))
