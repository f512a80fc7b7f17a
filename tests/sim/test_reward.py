import dataclasses

import pytest

from sim.records import OptionValue, Product, Purchase, Task
from sim.reward import score, type_score

PILLOW = Product(
    asin="100000000001",
    title="Lumi modern latex kids pillow - breathable, anti-mite",
    brand="Lumi",
    shop="Lumi official store",
    category=("home", "bedding", "pillow", "kids pillow"),
    attributes=("latex", "modern", "breathable", "anti-mite", "hypoallergenic"),
    options={
        "color": (OptionValue("blue"), OptionValue("extra large blue")),
        "size": (OptionValue("40x60cm", 50.0), OptionValue("48x74cm", 80.0)),
    },
    pricing=(50.0, 80.0),
    bullets=("feature: machine washable",),
)
QUILT = Product(
    asin="100000000002",
    title="Lumi modern cotton quilt - warm",
    brand="Lumi",
    shop="Lumi official store",
    category=("home", "bedding", "quilt", "kids quilt"),
    attributes=("cotton", "warm"),
    options={},
    pricing=(60.0,),
)
FILTER = Product(
    asin="100000000003",
    title="Aqua water filter cartridge",
    brand="Aqua",
    shop="Aqua store",
    category=("appliances", "water", "filter", "filter"),
    attributes=("carbon",),
    options={},
    pricing=(10.0,),
)


def goal(**kw) -> Task:
    base = dict(
        task_id=0, asin=PILLOW.asin, instruction="", instruction_simple="",
        attributes=("latex", "breathable"), options={"color": "blue", "size": "40x60cm"},
        price_upper=60.0, category=PILLOW.category, title=PILLOW.title, product_type="kids pillow",
    )
    base.update(kw)
    return Task(**base)


def test_exact_purchase_is_a_success():
    d = score(goal(), Purchase(PILLOW, {"color": "blue", "size": "40x60cm"}))
    assert (d.r_type, d.r_att, d.r_option, d.r_price, d.strict, d.loose, d.success, d.correct_product) == (
        1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0)


def test_price_is_the_selected_skus_not_the_list_price():
    # Upstream scored the list price whatever was selected; the 80.00 SKU is over the 60.00 budget.
    d = score(goal(), Purchase(PILLOW, {"color": "blue", "size": "48x74cm"}))
    assert d.r_price == 0.0 and d.strict == 0.0 and d.success == 0.0
    # size is the goal's second option, so one of two options matches: loose = (2 + 1 + 0) / (2 + 2 + 1)
    assert d.r_option == 0.5 and d.loose == pytest.approx(3 / 5)


def test_undetermined_sku_price_scores_zero():
    d = score(goal(options={"color": "blue"}), Purchase(PILLOW, {"color": "blue"}))
    assert d.r_price == 0.0 and d.r_option == 1.0


def test_wrong_type_is_not_full_credit():
    # Upstream's always-true empty `query` match gave R_type = 1 to anything.
    # Same domain (2 shared category nodes) but no type word in the title: WebShop's title_score == 0
    # branch overrides the category match.
    same_group = score(goal(options={}), Purchase(QUILT, {}))
    assert same_group.r_type == 0.0 and same_group.success == 0.0
    assert type_score(goal(), Purchase(FILTER, {})) == 0.0
    # Same type word in the title, other leaf: the weaker WebShop match.
    kids_quilt = dataclasses.replace(QUILT, title="Lumi kids quilt")
    assert type_score(goal(), Purchase(kids_quilt, {})) == 0.5


def test_attributes_fuzzy_or_substring_and_partial_credit():
    g = goal(attributes=("latex", "anti mite", "machine washable", "silk"), options={})
    d = score(g, Purchase(PILLOW, {"size": "40x60cm"}))
    # latex: exact attribute; "anti mite" vs "anti-mite": token_set_ratio 100 after the tokeniser
    # splits on '-'; "machine washable": substring of bullets; silk: missing.
    assert d.num_attr_matches == 3 and d.r_att == 0.75
    assert d.loose == pytest.approx(1.0 * (3 + 0 + 1) / (4 + 0 + 1))
    assert d.strict == pytest.approx(0.75) and d.success == 0.0


def test_option_subset_does_not_match():
    g = goal(options={"color": "blue"}, price_upper=1000.0)
    d = score(g, Purchase(PILLOW, {"color": "extra large blue", "size": "40x60cm"}))
    assert d.num_option_matches == 0 and d.r_option == 0.0


def test_no_purchase_scores_zero_everywhere():
    d = score(goal(), None)
    assert d.to_dict() == {k: 0 for k in d.to_dict()}


def test_no_goal_attributes_or_options_is_full_credit_for_those_parts():
    d = score(goal(attributes=(), options={}), Purchase(QUILT, {}))
    assert d.r_att == 1.0 and d.r_option == 1.0


def test_every_configurable_reward_is_registered_and_reads_its_component():
    import typing

    from sim.config import EnvConfig
    from sim.reward import REWARDS, RewardDetail

    assert set(REWARDS) == set(typing.get_args(typing.get_type_hints(EnvConfig)["reward"]))
    detail = RewardDetail(r_type=1.0, r_att=0.5, r_option=1.0, r_price=1.0, loose=0.75, strict=0.5)
    assert REWARDS["strict"](detail) == 0.5 and REWARDS["loose"](detail) == 0.75
