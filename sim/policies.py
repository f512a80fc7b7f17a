"""Two reference policies that speak the env's action grammar.

`OraclePolicy` reads the goal (privileged): it is the upper bound and writes the demonstrations
for warm-start SFT, so it behaves like a careful expert: confirms every requirement with the
shopper, searches with the most specific words, reads evidence pages before trusting a title,
pages through results, selects every option, checks the price of the chosen SKU, then buys.
`HeuristicPolicy` reads only what an agent sees: a baseline to report.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

from sim import reward
from sim.env import ShopEnv
from sim.records import Product, Purchase, Task
from sim.shopper import ATTRIBUTES, KIND, PRICE
from sim.text import normalize

_QUESTIONS = {
    "en": {KIND: "What kind of {type} do you want exactly?", ATTRIBUTES: "Do you have any specific requirements?",
           PRICE: "What is your budget?", "option": "Which {axis} would you like?",
           "all": "What kind of item do you want, what requirements do you have, what is your budget, and which options (color, size) do you prefer?"},
    "zh": {KIND: "您具体想要什么类型的{type}？", ATTRIBUTES: "您有什么具体要求吗？", PRICE: "您的预算是多少？",
           "option": "{axis}您想要哪个？", "all": "您想要什么类型的商品？有什么具体要求？预算多少？颜色尺寸等规格有什么偏好？"},
}


_BUDGET = re.compile(r"price lower than|budget|dollars|价格在|预算|元以内", re.IGNORECASE)


class Policy(Protocol):
    def reset(self, env: ShopEnv, observation: str) -> None: ...

    def act(self, env: ShopEnv, observation: str) -> str: ...


def run_episode(env: ShopEnv, policy: Policy, task_id: int) -> dict[str, Any]:
    """Plays one episode; returns the final info (reward_detail, stats, ...) and the actions."""
    result = env.reset(task_id)
    policy.reset(env, result.observation)
    actions = []
    while not result.done:
        action = policy.act(env, result.observation)
        actions.append(action)
        result = env.step(action)
    return {**result.info, "reward": result.reward, "actions": actions}


class OraclePolicy:
    def reset(self, env: ShopEnv, observation: str) -> None:
        assert env.task is not None
        self.task: Task = env.task
        self.fallback_used = False
        self.checked: set[int] = set()

    def _choice(self, product: Product) -> dict[str, str]:
        """Goal values where the product has them; the cheapest value on any other axis."""
        out = {}
        for axis, values in product.options.items():
            goal = self.task.options.get(axis)
            if goal is not None and any(o.value == goal for o in values):
                out[axis] = goal
            else:
                out[axis] = min(values, key=lambda o: o.price if o.price is not None else 0.0).value
        return out

    def _satisfies(self, env: ShopEnv, index: int) -> bool:
        product = env.world.catalog[index]
        return reward.score(self.task, Purchase(product, self._choice(product))).success == 1.0

    def act(self, env: ShopEnv, observation: str) -> str:
        task, page, lang = self.task, env.page, env.lang
        q = _QUESTIONS[lang]
        if env.shopper is not None and page.kind == "start" and env.shopper.tracker.missing():
            aspect = env.shopper.tracker.missing()[0]
            if aspect in (KIND, ATTRIBUTES, PRICE):
                return f"ask[{q[aspect].format(type=_short_type(task, lang))}]"
            return f"ask[{q['option'].format(axis=aspect)}]"
        if page.kind == "start":
            if self.fallback_used:
                return f"search[{task.title}]"
            # The request's option values go into the search too: the index ranks a product that
            # offers them first (rank 1 satisfies 80% of the default shop's test tasks with them,
            # 20% without), so the product the oracle then clicks is one its imitator can see the
            # reason for, not one only the catalog knows has the requested colour.
            sep = " " if lang == "en" else ""
            kind = task.product_type or (task.category[-1] if task.category else "")
            return f"search[{sep.join((kind, *task.attributes, *task.options.values()))}]"
        if page.kind == "results":
            size = env.config.page_size
            start = (page.page - 1) * size
            for index in page.results[start : start + size]:
                if self._satisfies(env, index):
                    return f"click[{env.result_button(index)}]"
            if page.page * size < len(page.results):
                return "click[next >]"
            self.fallback_used = True
            return "click[back to search]"
        if page.kind == "detail":
            return "click[< prev]"
        product = env.world.catalog[page.product]
        if page.product not in self.checked and env.config.show_detail_pages:
            self.checked.add(page.product)
            title = normalize(product.title)
            if any(normalize(a) not in title for a in task.attributes):
                return "click[features]"
        for axis, value in self._choice(product).items():
            if page.selected.get(axis) != value:
                return f"click[{value}]"
        return "click[buy now]"


class RecoveringOraclePolicy(OraclePolicy):
    """The oracle, making one mistake a policy makes and recovering from it: demonstrations of
    recovery, whose mistaken actions a trainer leaves out of the loss (`mistakes`).

    `mistake`:
    - 'buy_early': with one option axis still unchosen, click `buy now`; the shop refuses and names
      the axis; then choose it and buy.
    - 'wrong_product': open a result on the page that lacks a requested option value, click that
      value (not on the page: refused), go back with `< prev` and open the right result.
    Where the episode gives the mistake no room (a product without options, no result on the page
    lacking a requested value), the episode is the oracle's own.
    """

    MISTAKES = ("buy_early", "wrong_product")

    def __init__(self, mistake: str):
        if mistake not in self.MISTAKES:
            raise ValueError(f"mistake must be one of {self.MISTAKES}, got {mistake!r}")
        self.mistake = mistake

    def reset(self, env: ShopEnv, observation: str) -> None:
        super().reset(env, observation)
        self.mistakes: list[int] = []  # indices of this episode's mistaken actions
        self._actions = 0
        self._plan: list[tuple[str, bool]] = []  # (action, mistaken) to play before the oracle's own
        self._made = False

    def act(self, env: ShopEnv, observation: str) -> str:
        if not self._made:
            self._plan = self._mistake(env)
            self._made = bool(self._plan)
        action, mistaken = self._plan.pop(0) if self._plan else (super().act(env, observation), False)
        if mistaken:
            self.mistakes.append(self._actions)
        self._actions += 1
        return action

    def _mistake(self, env: ShopEnv) -> list[tuple[str, bool]]:
        """The mistake and its recovery where this page gives it room, else []."""
        page, catalog = env.page, env.world.catalog
        if self.mistake == "buy_early" and page.kind == "item" and env.config.require_all_options:
            product = catalog[page.product]
            unchosen = [axis for axis in product.options if axis not in page.selected]
            if len(unchosen) == 1:
                return [("click[buy now]", True)]
        if self.mistake == "wrong_product" and page.kind == "results":
            size = env.config.page_size
            start = (page.page - 1) * size
            for index in page.results[start : start + size]:
                lacking = self._lacking_value(catalog[index])
                if lacking is not None:
                    return [(f"click[{env.result_button(index)}]", True), (f"click[{lacking}]", True),
                            ("click[< prev]", False)]
        return []

    def _lacking_value(self, product: Product) -> str | None:
        """A requested option value `product` does not offer, or None."""
        for axis, goal in self.task.options.items():
            if not any(o.value == goal for o in product.options.get(axis, ())):
                return goal
        return None


class HeuristicPolicy:
    """Non-oracle baseline: one search with the request, first result, options named in the text."""

    def reset(self, env: ShopEnv, observation: str) -> None:
        self.request = env.visible_instruction() or ""
        self.asked = False
        self.lang = env.lang

    def act(self, env: ShopEnv, observation: str) -> str:
        page = env.page
        if env.shopper is not None and not self.asked:
            self.asked = True
            return f"ask[{_QUESTIONS[self.lang]['all']}]"
        if env.shopper is not None and observation.startswith("Shopper:") and page.kind == "start":
            self.request += " " + observation.split("\n", 1)[0].removeprefix("Shopper:")
        if page.kind == "start":
            # Everything the shopper said except the budget, which is not a search term.
            kept = [c for c in re.split(r"[.,。，]", self.request) if not _BUDGET.search(c)]
            query = " ".join(c.strip() for c in kept if c.strip())
            return f"search[{query or 'product'}]"
        if page.kind == "results":
            if not page.results:
                return "click[back to search]"
            return f"click[{env.result_button(page.results[(page.page - 1) * env.config.page_size])}]"
        if page.kind == "detail":
            return "click[< prev]"
        product = env.world.catalog[page.product]
        text = normalize(self.request)
        for axis, values in product.options.items():
            if axis not in page.selected:
                named = [v.value for v in values if _mentions(text, normalize(v.value))]
                return f"click[{(named or [values[0].value])[0]}]"
        return "click[buy now]"


def _mentions(text: str, phrase: str) -> bool:
    """Whole-phrase match: a size 's' must not match inside 'dress'."""
    return re.search(rf"(?<![a-z0-9.]){re.escape(phrase)}(?![a-z0-9])", text) is not None


def _short_type(task: Task, lang: str) -> str:
    kind = task.product_type or (task.category[-1] if task.category else "")
    return kind.split()[-1] if lang == "en" and kind else kind
