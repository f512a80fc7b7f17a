"""Plain records shared by the catalog, the environment, the reward and the service."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class OptionValue:
    value: str
    price: float | None = None  # the SKU's price when this value is selected; None: no effect


@dataclasses.dataclass(frozen=True)
class Product:
    """One catalog item, in ShopSimulator's item schema.

    `options` maps each option axis (e.g. colour, size) to its values in display order. At most one
    axis carries per-value prices, so the price of a selected SKU is always well defined.
    """

    asin: str
    title: str
    brand: str
    shop: str
    category: tuple[str, ...]
    attributes: tuple[str, ...]
    options: Mapping[str, tuple[OptionValue, ...]]
    pricing: tuple[float, ...]  # (price,) or (min, max)
    description: str = ""
    bullets: tuple[str, ...] = ()

    @functools.cached_property  # products are immutable; pages ask for this 20 times per render
    def price_axis(self) -> str | None:
        for axis, values in self.options.items():
            if any(v.price is not None for v in values):
                return axis
        return None

    def sku_price(self, selected: Mapping[str, str]) -> float | None:
        """Price of the SKU picked by `selected` (axis -> value); None when it is not determined.

        The upstream simulator scored the list price whatever was selected; this is the fix.
        """
        axis = self.price_axis
        if axis is None:
            return self.pricing[0] if len(self.pricing) == 1 else None
        chosen = selected.get(axis)
        for v in self.options[axis]:
            if v.value == chosen:
                return v.price
        return None

    @functools.cached_property
    def list_price_text(self) -> str:
        """The price as a results page shows it (nothing selected)."""
        return self.price_text()

    def price_text(self, selected: Mapping[str, str] | None = None) -> str:
        price = self.sku_price(selected or {})
        if price is not None and (selected or self.price_axis is None):
            return f"{price:.2f}"
        lo, hi = min(self.pricing), max(self.pricing)
        return f"{lo:.2f}" if lo == hi else f"{lo:.2f} to {hi:.2f}"


@dataclasses.dataclass(frozen=True)
class Task:
    """One shopping task: what the shopper wants and the product it was written for.

    Attributes:
      instruction: the full need, price hint included ("... price lower than 60.00 dollars").
      instruction_simple: the vague opening request (multi-turn mode opens with it).
      instruction_sample: persona tasks only: the full need with the hidden requirement removed; the
        agent must recover it from the profile (ShopSimulator never shipped this field).
      attributes / options: goal attributes and goal options (axis -> value).
      price_upper: exactly the budget stated in `instruction`.
      user_persona / reason_key: the profile and the 'group-field' key holding the hidden need.
      hidden_aspect: which requirement the profile holds: 'attributes', 'price', or an option axis.
      hidden_value: the requirement itself (the attribute, option value or budget).
    """

    task_id: int
    asin: str
    instruction: str
    instruction_simple: str
    attributes: tuple[str, ...]
    options: Mapping[str, str]
    price_upper: float
    category: tuple[str, ...]
    title: str
    product_type: str = ""
    instruction_sample: str | None = None
    user_persona: Mapping[str, Any] | None = None
    reason_key: str | None = None
    hidden_aspect: str | None = None
    hidden_value: str | None = None

    @property
    def goal_options(self) -> list[str]:
        return list(self.options.values())

    @property
    def is_persona(self) -> bool:
        return self.user_persona is not None

    def to_goal(self) -> dict[str, Any]:
        """The goal dict ShopSimulator's service returns (`get_existed_goals` field names)."""
        return {
            "asin": self.asin,
            "category": " › ".join(self.category),
            "query": "",
            "name": self.title,
            "instruction_text": self.instruction,
            "instruction_simple": self.instruction_simple,
            "attributes": list(self.attributes),
            "price_upper": self.price_upper,
            "goal_options": self.goal_options,
            "user_persona": self.user_persona,
            "reason_key": self.reason_key,
            "weight": 1,
        }


@dataclasses.dataclass(frozen=True)
class Purchase:
    """What was bought: the product and the options selected when `buy now` was clicked."""

    product: Product
    selected: Mapping[str, str]

    @property
    def price(self) -> float | None:
        return self.product.sku_price(self.selected)

    def to_dict(self) -> dict[str, Any]:
        """ShopSimulator's `purchase` field."""
        p = self.product
        return {
            "asin": p.asin,
            "category": " › ".join(p.category),
            "query": "",
            "name": p.title,
            "product_category": " › ".join(p.category),
            "attributes": list(p.attributes),
            "price": self.price,
            "options": dict(self.selected),
        }


class Catalog(Protocol):
    """A read-only product collection with its tasks; synthetic or loaded from real files."""

    lang: str

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Product: ...

    def index_of(self, asin: str) -> int | None: ...

    @property
    def tasks(self) -> Sequence[Task]: ...
