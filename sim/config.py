"""Typed, validated simulator options.

The ml-collections files in `configs/` are the user-facing config; they are converted once, at
the entry point, into these frozen dataclasses so the rest of `sim/` never reads an untyped bag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from sim.reward import REWARDS

Lang = Literal["en", "zh"]
Mode = Literal["single", "multi"]
ShopperBackend = Literal["rule", "openai"]


class ConfigError(ValueError):
    """A simulator option is out of range or inconsistent; the message names the field and fix."""


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CatalogConfig:
    """Synthetic catalog, or a real item file when `items_path` is set.

    Attributes:
      seed: seeds products, tasks and splits; the same seed gives the same catalog byte for byte.
      num_products: catalog size (Catalog-Fine ~20K; Catalog-Full scale 1M).
      products_per_subcategory: size of each group of near-identical products.
      lang: surface language of every generated text.
      persona_fraction: share of tasks that carry a user profile and a hidden requirement.
      id_digits: length of product ids (ShopSimulator's are 12 digits); shorter ids shorten pages
        and clicks. Needs num_products <= 10**(id_digits-1).
      items_path: a ShopSimulator `items_*.json[.gz]` or WebShop `items_shuffle*.json` file.
      instructions_path: WebShop's `items_human_ins.json` (only with a WebShop items file).
    """

    seed: int = 0
    num_products: int = 20_160
    products_per_subcategory: int = 120
    lang: Lang = "en"
    persona_fraction: float = 0.3
    id_digits: int = 12
    items_path: str = ""
    instructions_path: str = ""

    def __post_init__(self) -> None:
        _check(self.num_products >= 1, f"catalog.num_products must be >= 1, got {self.num_products}")
        _check(
            self.products_per_subcategory >= 2,
            "catalog.products_per_subcategory must be >= 2 (a group of near-identical items), "
            f"got {self.products_per_subcategory}",
        )
        _check(self.lang in ("en", "zh"), f"catalog.lang must be 'en' or 'zh', got {self.lang!r}")
        _check(
            0.0 <= self.persona_fraction <= 1.0,
            f"catalog.persona_fraction must be in [0, 1], got {self.persona_fraction}",
        )
        _check(
            2 <= self.id_digits <= 12 and self.num_products <= 10 ** (self.id_digits - 1),
            f"catalog.id_digits must be in [2, 12] with num_products <= 10**(id_digits-1), got "
            f"id_digits={self.id_digits} for {self.num_products} products",
        )
        _check(
            not self.instructions_path or bool(self.items_path),
            "catalog.instructions_path needs catalog.items_path (a WebShop items file)",
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class SplitConfig:
    """Fixed train/validation/test task splits; test and validation are carved first."""

    seed: int = 233
    num_test: int = 400
    num_validation: int = 200

    def __post_init__(self) -> None:
        _check(self.num_test >= 0 and self.num_validation >= 0, "splits sizes must be >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """Field-weighted BM25 (BM25F: weighted term frequencies, one length normalisation).

    Weights follow the SQLite FTS5 forks of ShopSimulator (title 3.0, brand/shop 2.0, ...).
    """

    k1: float = 1.2
    b: float = 0.75
    title_weight: float = 3.0
    brand_weight: float = 2.0
    category_weight: float = 2.0
    attribute_weight: float = 1.5
    option_weight: float = 1.2

    def __post_init__(self) -> None:
        _check(self.k1 > 0, f"search.k1 must be > 0, got {self.k1}")
        _check(0.0 <= self.b <= 1.0, f"search.b must be in [0, 1], got {self.b}")
        for name in ("title", "brand", "category", "attribute", "option"):
            w = getattr(self, f"{name}_weight")
            _check(w >= 0, f"search.{name}_weight must be >= 0, got {w}")

    @property
    def field_weights(self) -> dict[str, float]:
        return {
            "title": self.title_weight,
            "brand": self.brand_weight,
            "category": self.category_weight,
            "attributes": self.attribute_weight,
            "options": self.option_weight,
        }


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShopperConfig:
    """The simulated shopper of multi-turn mode.

    Attributes:
      backend: 'rule' (deterministic, default) or 'openai' (any OpenAI-compatible chat endpoint).
      base_url / model / api_key_env / temperature / timeout_s / max_retries: for 'openai'.
    """

    backend: ShopperBackend = "rule"
    base_url: str = "http://127.0.0.1:30000/v1"
    model: str = "default"
    api_key_env: str = "OPENAI_API_KEY"
    temperature: float = 0.7
    timeout_s: float = 60.0
    max_retries: int = 5

    def __post_init__(self) -> None:
        _check(
            self.backend in ("rule", "openai"),
            f"shopper.backend must be 'rule' or 'openai', got {self.backend!r}",
        )
        _check(self.max_retries >= 0, "shopper.max_retries must be >= 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class EnvConfig:
    """Episode rules.

    Attributes:
      mode: 'single' (the agent reads the instruction) or 'multi' (a shopper holds it).
      persona: show persona tasks' profile and the vague request instead of the instruction.
      results_top_n / page_size: retrieved results and results per page (ShopSimulator 150/20).
      max_steps: env actions (including questions to the shopper) before the episode is cut.
      require_all_options: `buy now` is refused until every option axis is chosen.
      enforce_confirmation: in multi-turn mode, `buy now` is refused while the shopper has not
        yet revealed every requirement (the shopper always *says* no; this makes it binding).
      show_detail_pages: expose Description/Features/Reviews pages.
      reward: the episode reward returned by the env: 'strict' (the study's) or 'loose' (upstream).
      result_labels: how a results page names its products, which is also what clicks them:
        'asin' (the product id, as ShopSimulator and WebShop do) or 'rank' (1, 2, ... down each
        page). 'rank' spares a policy copying a long id from the page, which a small model
        trained from scratch does not learn in minutes (the CPU quickstart's setting).
    """

    mode: Mode = "single"
    persona: bool = False
    results_top_n: int = 150
    page_size: int = 20
    max_steps: int = 40
    require_all_options: bool = True
    enforce_confirmation: bool = False
    show_detail_pages: bool = True
    reward: Literal["strict", "loose"] = "strict"
    result_labels: Literal["asin", "rank"] = "asin"

    def __post_init__(self) -> None:
        _check(self.reward in REWARDS, f"env.reward must be one of {sorted(REWARDS)}, got {self.reward!r}")
        _check(self.result_labels in ("asin", "rank"),
               f"env.result_labels must be 'asin' or 'rank', got {self.result_labels!r}")
        _check(self.mode in ("single", "multi"), f"env.mode must be 'single' or 'multi', got {self.mode!r}")
        _check(self.results_top_n >= 1, f"env.results_top_n must be >= 1, got {self.results_top_n}")
        _check(self.page_size >= 1, f"env.page_size must be >= 1, got {self.page_size}")
        _check(self.max_steps >= 1, f"env.max_steps must be >= 1, got {self.max_steps}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """The ShopSimulator-compatible HTTP service."""

    host: str = "127.0.0.1"
    port: int = 5000
    pool_size: int = 64
    session_ttl_s: float = 600.0
    acquire_timeout_s: float = 5.0

    def __post_init__(self) -> None:
        _check(0 <= self.port < 65536, f"server.port must be in [0, 65535], got {self.port}")
        _check(self.pool_size >= 1, f"server.pool_size must be >= 1, got {self.pool_size}")
        _check(self.session_ttl_s > 0, "server.session_ttl_s must be > 0")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimConfig:
    catalog: CatalogConfig = dataclasses.field(default_factory=CatalogConfig)
    splits: SplitConfig = dataclasses.field(default_factory=SplitConfig)
    search: SearchConfig = dataclasses.field(default_factory=SearchConfig)
    env: EnvConfig = dataclasses.field(default_factory=EnvConfig)
    shopper: ShopperConfig = dataclasses.field(default_factory=ShopperConfig)
    server: ServerConfig = dataclasses.field(default_factory=ServerConfig)

    @classmethod
    def from_mapping(cls, cfg: Mapping[str, Any]) -> SimConfig:
        """Builds from a nested mapping (an ml-collections ConfigDict or a plain dict).

        Unknown keys are an error, never ignored: a typo must not silently fall back to a default.
        """
        unknown = set(cfg.keys()) - set(_SECTIONS)
        _check(not unknown, f"unknown sim config section(s) {sorted(unknown)}; known: {sorted(_SECTIONS)}")
        return cls(**{k: _build(_SECTIONS[k], cfg[k], f"sim.{k}") for k in cfg.keys()})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_SECTIONS = {
    "catalog": CatalogConfig,
    "splits": SplitConfig,
    "search": SearchConfig,
    "env": EnvConfig,
    "shopper": ShopperConfig,
    "server": ServerConfig,
}


def _build(section_cls: type, values: Mapping[str, Any], where: str):
    if isinstance(values, section_cls):
        return values
    known = {f.name for f in dataclasses.fields(section_cls)}
    unknown = set(values.keys()) - known
    _check(not unknown, f"unknown field(s) {sorted(unknown)} in {where}; known: {sorted(known)}")
    return section_cls(**{k: values[k] for k in values.keys()})
