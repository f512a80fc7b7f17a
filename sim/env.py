"""The shopping environment: ShopSimulator's page machine over a shared, read-only world.

Actions follow the WebShop grammar: `search[keywords]` (start page only), `click[value]` (a current
clickable, case-insensitive), and in multi-turn mode `ask[question]` (to the shopper).
`click[buy now]` is the only terminal action. An invalid action changes nothing: the observation
explains why and repeats the page, and the episode counts it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, Literal

from sim import render, reward
from sim.config import EnvConfig, ShopperConfig
from sim.records import Purchase, Task
from sim.shopper import Shopper, make_shopper
from sim.world import World

PageKind = Literal["start", "results", "item", "detail"]
_ACTION_RE = re.compile(r"^\s*([A-Za-z_]+)\s*\[(.*)\]\s*$", re.DOTALL)
MAX_ACTION_CHARS = 2000
MAX_QUERY_CHARS = 500


@dataclasses.dataclass(frozen=True)
class Page:
    kind: PageKind = "start"
    query: str = ""
    results: tuple[int, ...] = ()  # product indices, best first
    page: int = 1
    product: int = -1
    selected: Mapping[str, str] = dataclasses.field(default_factory=dict)
    detail: str = ""


@dataclasses.dataclass
class EpisodeStats:
    steps: int = 0
    invalid_actions: int = 0
    searches: int = 0
    product_visits: int = 0  # entering a product page; option refreshes do not count
    questions: int = 0
    refused_purchases: int = 0
    unconfirmed_purchase: bool = False
    truncated: bool = False


@dataclasses.dataclass(frozen=True)
class StepResult:
    observation: str
    reward: float
    done: bool
    info: dict[str, Any]


class ShopEnv:
    """One episode at a time over `world`; cheap to create, so keep one per concurrent episode."""

    def __init__(self, world: World, config: EnvConfig | None = None, shopper: ShopperConfig | None = None):
        self.world = world
        self.config = config or world.config.env
        self.shopper_config = shopper or world.config.shopper
        self.lang = world.catalog.lang
        self.task: Task | None = None
        self.page = Page()
        self.stats = EpisodeStats()
        self.done = True
        self.shopper: Shopper | None = None
        self.purchase: Purchase | None = None

    # -- episode -----------------------------------------------------------------------------

    def reset(self, task_id: int) -> StepResult:
        tasks = self.world.catalog.tasks
        if not 0 <= task_id < len(tasks):
            raise IndexError(f"task id {task_id} out of range [0, {len(tasks)})")
        self.task = tasks[task_id]
        self.page = Page()
        self.stats = EpisodeStats()
        self.done = False
        self.purchase = None
        self.shopper = None
        persona = self.config.persona and self.task.is_persona
        obs = self._render()
        if self.config.mode == "multi":
            self.shopper = make_shopper(self.task, self.lang, persona, self.shopper_config)
            obs = f"{render.LABELS[self.lang]['shopper']}: {self.shopper.opening()}\n{obs}"
        return StepResult(obs, 0.0, False, {"view": self.agent_view()})

    def agent_view(self) -> dict[str, Any]:
        """What the agent may know at the start: never the goal options or the reason key."""
        task = self._require_task()
        persona = self.config.persona and task.is_persona
        view: dict[str, Any] = {"task_id": task.task_id, "instruction": self.visible_instruction()}
        if persona:
            view["user_persona"] = task.user_persona
        return view

    def visible_instruction(self) -> str | None:
        task = self._require_task()
        if self.config.mode == "multi":
            return None
        if self.config.persona and task.is_persona:
            return task.instruction_sample
        return task.instruction

    def step(self, action: str) -> StepResult:
        if self.done or self.task is None:
            raise RuntimeError("step() called on a finished episode; call reset(task_id) first")
        self.stats.steps += 1
        result = self._dispatch(action if isinstance(action, str) else str(action))
        if not result.done and self.stats.steps >= self.config.max_steps:
            self.stats.truncated = True
            return self._finish(result.observation)
        return result

    # -- actions -----------------------------------------------------------------------------

    def available_actions(self) -> dict[str, Any]:
        return {"has_search_bar": self.page.kind == "start", "clickables": self._clickables()}

    def _clickables(self) -> list[str]:
        page, catalog = self.page, self.world.catalog
        if page.kind == "results":
            out = ["back to search"]
            if page.page > 1:
                out.append("< prev")
            if page.page * self.config.page_size < len(page.results):
                out.append("next >")
            # Clicks are compared lower-cased, so asins are listed lower-cased too (WebShop's are
            # upper-case: B07...; the page still shows them as they are, as WebShop does).
            out.extend(label.lower() for label in self._result_labels())
            return out
        if page.kind == "item":
            out = ["back to search", "< prev"]
            for values in catalog[page.product].options.values():
                out.extend(v.value.lower() for v in values)
            if self.config.show_detail_pages:
                out += [d.lower() for d in render.DETAIL_PAGES]
            out.append("buy now")
            return out
        if page.kind == "detail":
            return ["back to search", "< prev"]
        return []

    def _dispatch(self, action: str) -> StepResult:
        if len(action) > MAX_ACTION_CHARS:
            return self._invalid(f"action longer than {MAX_ACTION_CHARS} characters")
        m = _ACTION_RE.match(action)
        if not m:
            return self._invalid("expected search[...], click[...]" + (" or ask[...]" if self.config.mode == "multi" else ""))
        verb, arg = m.group(1).lower(), m.group(2).strip()
        if verb == "search":
            return self._search(arg)
        if verb == "click":
            return self._click(arg)
        if verb in ("ask", "ask_shopper") and self.config.mode == "multi":
            return self._ask(arg)
        return self._invalid(f"unknown action '{verb}'")

    def _search(self, query: str) -> StepResult:
        if self.page.kind != "start":
            return self._invalid("search is only available on the search page; click[back to search] first")
        if not query:
            return self._invalid("empty search")
        query = query[:MAX_QUERY_CHARS]
        hits = self.world.index.search(query, self.config.results_top_n)
        self.stats.searches += 1
        self.page = Page(kind="results", query=query, results=tuple(hits), page=1)
        return self._ok()

    def _click(self, value: str) -> StepResult:
        v = value.strip().lower()
        if v not in self._clickables():
            return self._invalid(f"'{value[:80]}' is not clickable on this page")
        page = self.page
        if v == "back to search":
            self.page = Page()
        elif v == "next >":
            self.page = dataclasses.replace(page, page=page.page + 1)
        elif v == "< prev":
            if page.kind == "results":
                self.page = dataclasses.replace(page, page=page.page - 1)
            elif page.kind == "item":
                self.page = dataclasses.replace(page, kind="results", product=-1, selected={})
            else:
                self.page = dataclasses.replace(page, kind="item", detail="")
        elif page.kind == "results":
            labels = [label.lower() for label in self._result_labels()]
            index = page.results[self._page_slice()[labels.index(v)]]
            self.page = dataclasses.replace(page, kind="item", product=index, selected={})
            self.stats.product_visits += 1
        elif v == "buy now":
            return self._buy()
        elif v in ("description", "features", "reviews"):
            self.page = dataclasses.replace(page, kind="detail", detail=v)
        else:
            product = self.world.catalog[page.product]
            for axis, values in product.options.items():
                if any(o.value.lower() == v for o in values):
                    value_exact = next(o.value for o in values if o.value.lower() == v)
                    self.page = dataclasses.replace(page, selected={**page.selected, axis: value_exact})
                    break
        return self._ok()

    def _buy(self) -> StepResult:
        product = self.world.catalog[self.page.product]
        missing = [a for a in product.options if a not in self.page.selected]
        if missing and self.config.require_all_options:
            return self._invalid("choose an option for every axis before buying: " + ", ".join(missing))
        if self.shopper is not None and self.shopper.tracker.missing():
            label = render.LABELS[self.lang]["shopper"]
            if self.config.enforce_confirmation:
                self.stats.refused_purchases += 1
                return StepResult(f"{label}: {self.shopper.refusal()}\n{self._render()}", 0.0, False, self._info())
            self.stats.unconfirmed_purchase = True
        self.purchase = Purchase(product, dict(self.page.selected))
        return self._finish("Thank you for shopping with us!")

    def _ask(self, question: str) -> StepResult:
        assert self.shopper is not None
        if not question:
            return self._invalid("empty question")
        self.stats.questions += 1
        reply = self.shopper.answer(question[:MAX_ACTION_CHARS])
        label = render.LABELS[self.lang]["shopper"]
        return StepResult(f"{label}: {reply}\n{self._render()}", 0.0, False, self._info())

    def result_button(self, index: int) -> str:
        """The button that opens product `index` from the current results page (its asin or rank)."""
        if self.page.kind != "results":
            raise ValueError(f"result_button needs a results page, not {self.page.kind!r}")
        shown = [self.page.results[i] for i in self._page_slice()]
        if index not in shown:
            raise ValueError(f"product {index} is not on the current results page")
        return self._result_labels()[shown.index(index)]

    # -- observations ------------------------------------------------------------------------

    def _result_labels(self) -> list[str]:
        """The label of each product on the current results page, in page order."""
        page_slice = self._page_slice()
        if self.config.result_labels == "rank":
            return [str(k + 1) for k in range(len(page_slice))]
        return [self.world.catalog[self.page.results[i]].asin for i in page_slice]

    def _page_slice(self) -> range:
        size = self.config.page_size
        start = (self.page.page - 1) * size
        return range(start, min(start + size, len(self.page.results)))

    def _render(self) -> str:
        page, catalog = self.page, self.world.catalog
        if page.kind == "start":
            return render.start_page(self.lang, self.visible_instruction())
        if page.kind == "results":
            products = [catalog[page.results[i]] for i in self._page_slice()]
            has_next = page.page * self.config.page_size < len(page.results)
            return render.results_page(products, page.page, len(page.results), has_next, self._result_labels())
        product = catalog[page.product]
        if page.kind == "item":
            return render.item_page(self.lang, product, page.selected, self.config.show_detail_pages)
        return render.detail_page(self.lang, product, page.detail)

    def _info(self) -> dict[str, Any]:
        # A shallow copy is asdict's result for these flat int/bool fields, at 1/20 of the cost
        # (asdict deep-copies recursively; it was ~20 us of every step).
        return {"stats": dict(vars(self.stats))}

    def _ok(self) -> StepResult:
        return StepResult(self._render(), 0.0, False, self._info())

    def _invalid(self, why: str) -> StepResult:
        self.stats.invalid_actions += 1
        return StepResult(f"Invalid action: {why}.{render.SEP}{self._render()}", 0.0, False, self._info())

    def _finish(self, observation: str) -> StepResult:
        task = self._require_task()
        self.done = True
        detail = reward.score(task, self.purchase)
        value = reward.REWARDS[self.config.reward](detail)
        info = self._info()
        info.update(
            reward_detail=detail.to_dict(),
            purchase=self.purchase.to_dict() if self.purchase else None,
            goal=task.to_goal(),
        )
        return StepResult(observation, value, True, info)

    def _require_task(self) -> Task:
        if self.task is None:
            raise RuntimeError("no episode: call reset(task_id) first")
        return self.task
