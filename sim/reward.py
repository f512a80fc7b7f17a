"""Episode reward: ShopSimulator's components with the upstream bugs fixed.

    r_type   1.0 same product type (leaf category); else WebShop's weaker match: 0.5 when the
             category shares >= 2 nodes or title_score > 0.2; then 0.1 when title_score < 0.1 and
             0.0 when title_score == 0. title_score is the share of the goal type's words found in
             the bought title (the upstream noun overlap, without a POS tagger). The always-true
             `query` match of upstream (every query was "") is gone.
    r_att    share of goal attributes found: rapidfuzz token_set_ratio > 85 against a product
             attribute, else a substring of title, bullets or description.
    r_option share of goal options among the *selected* options (token_sort_ratio > 85: a subset
             such as "large" in "extra large" must not count, unlike token_set_ratio).
    r_price  [price of the selected SKU <= price_upper]; 0 when the SKU price is undetermined.
    loose    r_type * (M_att + M_opt + r_price) / (N_att + N_opt + 1)
    strict   r_type * r_att * r_option * r_price
    success  1 when all four components are 1 (the gold product is not required)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from rapidfuzz import fuzz

from sim.records import Purchase, Task
from sim.text import normalize, tokenize

FUZZY_THRESHOLD = 85.0


@dataclasses.dataclass(frozen=True)
class RewardDetail:
    r_type: float = 0.0
    r_att: float = 0.0
    r_option: float = 0.0
    r_price: float = 0.0
    loose: float = 0.0
    strict: float = 0.0
    success: float = 0.0
    correct_product: float = 0.0
    num_attr_matches: int = 0
    num_option_matches: int = 0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


NO_PURCHASE = RewardDetail()


def type_score(goal: Task, purchase: Purchase) -> float:
    got = purchase.product
    if got.category and goal.category and got.category[-1] == goal.category[-1]:
        return 1.0
    want = set(tokenize(goal.product_type or (goal.category[-1] if goal.category else goal.title)))
    title_score = len(want & set(tokenize(got.title))) / len(want) if want else 0.2
    shared = 0
    for a, b in zip(goal.category, got.category):
        if a != b:
            break
        shared += 1
    r = 0.5 if (shared >= 2 or title_score > 0.2) else 0.0
    if title_score < 0.1:
        r = 0.1
    if title_score == 0.0:
        r = 0.0
    return r


def attribute_matches(goal: Task, purchase: Purchase) -> int:
    p = purchase.product
    haystack = normalize(" ".join((p.title, " ".join(p.bullets), p.description)))
    attrs = [normalize(a) for a in p.attributes]
    n = 0
    for want in goal.attributes:
        w = normalize(want)
        if any(fuzz.token_set_ratio(w, a) > FUZZY_THRESHOLD for a in attrs) or w in haystack:
            n += 1
    return n


def option_matches(goal: Task, purchase: Purchase) -> int:
    chosen = [normalize(v) for v in purchase.selected.values()]
    return sum(
        any(fuzz.token_sort_ratio(normalize(want), c) > FUZZY_THRESHOLD for c in chosen)
        for want in goal.options.values()
    )


def score(goal: Task, purchase: Purchase | None) -> RewardDetail:
    """Scores a finished episode; no purchase scores 0 on every component."""
    if purchase is None:
        return NO_PURCHASE
    r_type = type_score(goal, purchase)
    m_att = attribute_matches(goal, purchase)
    m_opt = option_matches(goal, purchase)
    n_att, n_opt = len(goal.attributes), len(goal.options)
    r_att = m_att / n_att if n_att else 1.0
    r_option = m_opt / n_opt if n_opt else 1.0
    price = purchase.price
    r_price = 1.0 if price is not None and price <= goal.price_upper + 1e-9 else 0.0
    strict = r_type * r_att * r_option * r_price
    return RewardDetail(
        r_type=r_type,
        r_att=r_att,
        r_option=r_option,
        r_price=r_price,
        loose=r_type * (m_att + m_opt + r_price) / (n_att + n_opt + 1),
        strict=strict,
        success=float(r_type == 1.0 and r_att == 1.0 and r_option == 1.0 and r_price == 1.0),
        correct_product=float(purchase.product.asin == goal.asin),
        num_attr_matches=m_att,
        num_option_matches=m_opt,
    )


# The episode reward an env returns (`EnvConfig.reward`), by name: a new reward is one function of
# the components and one entry here (and its name among `EnvConfig.reward`'s values).
REWARDS: dict[str, Callable[[RewardDetail], float]] = {
    "strict": lambda d: d.strict,  # the study's: the product must be right in every component
    "loose": lambda d: d.loose,  # upstream ShopSimulator's partial credit
}
