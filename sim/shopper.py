"""The simulated shopper of multi-turn mode.

The shopper knows the full instruction and the goal options (not the target product), opens
vaguely, answers only what it is asked, and refuses a purchase while some requirement has not been
asked about. A persona shopper answers the question about its hidden requirement with "as I
usually do", which sends the agent to the profile.

Two backends share one `ConfirmationTracker` (which requirements the agent has asked about, from
keywords in its questions), so the environment can enforce confirmation whatever speaks:
`RuleShopper` (deterministic, the default) and `OpenAIShopper` (any OpenAI-compatible endpoint).
"""

from __future__ import annotations

import logging
import os
import re
from typing import Protocol

import httpx

from sim.config import ShopperConfig
from sim.records import Task
from sim.retry import Retryable, RetryPolicy, is_transient
from sim.text import normalize

log = logging.getLogger(__name__)

KIND, ATTRIBUTES, PRICE = "kind", "attributes", "price"

_ASPECT_WORDS = {
    KIND: ("kind", "type", "sort of", "variant", "category", "类型", "种类", "哪种", "哪类", "什么样"),
    ATTRIBUTES: ("feature", "features", "requirement", "requirements", "attribute", "attributes", "material",
                 "function", "prefer", "preference", "preferences", "detail", "details", "other", "要求", "需求", "特点", "功能", "材质", "属性", "偏好", "细节", "其他", "风格", "style"),
    PRICE: ("price", "prices", "budget", "cost", "spend", "expensive", "cheap", "afford", "how much",
            "价格", "预算", "多少钱", "价位", "便宜", "贵"),
}
_OPTION_WORDS = ("option", "options", "spec", "specs", "规格", "选项", "款式")
_AXIS_SYNONYMS = {
    "color": ("color", "colour", "colors", "colours", "颜色", "色"),
    "颜色分类": ("color", "colour", "colors", "colours", "颜色", "色"),
    "flavor": ("flavor", "flavour", "taste", "口味", "味道"),
    "口味": ("flavor", "flavour", "taste", "口味", "味道"),
    "scent": ("scent", "fragrance", "smell", "香型", "香味"),
    "香型": ("scent", "fragrance", "smell", "香型", "香味"),
}
_SIZE_WORDS = ("size", "sizes", "尺寸", "尺码", "大小", "规格", "多大")
_GENERIC = ("what do you need", "what are you looking for", "tell me more", "more about", "details",
            "需要什么", "想要什么", "具体", "详细")
_CONFIRM = ("should i buy", "shall i buy", "can i buy", "buy it", "buy this", "purchase", "confirm",
            "order", "下单", "购买", "买这", "确认")

_TEXT = {
    "en": {
        "kind": "I want a {kind}.",
        "attributes": "It should be {atts}.",
        "price": "My budget is under {price:.2f} dollars.",
        "option": "For {axis}, I want {value}.",
        "usual": "Just as I usually do.",
        "unclear": "Sorry, I'm not sure what you mean. I just want a good {type}.",
        "ok": "Yes, that's everything. Please buy it.",
        "refuse": "Wait, the information isn't complete yet. You haven't asked about my {missing}.",
        "names": {KIND: "type", ATTRIBUTES: "requirements", PRICE: "budget"},
        "join": " and ",
    },
    "zh": {
        "kind": "我要{kind}。",
        "attributes": "要{atts}的。",
        "price": "预算{price:.2f}元以内。",
        "option": "{axis}要{value}。",
        "usual": "按照我以往的习惯即可。",
        "unclear": "不太明白您的意思，我就想买个好点的{type}。",
        "ok": "对，就这些，帮我下单吧。",
        "refuse": "信息还不完整，您还没问我{missing}。",
        "names": {KIND: "类型", ATTRIBUTES: "具体要求", PRICE: "预算"},
        "join": "、",
    },
}


def _mentions(q: str, words) -> bool:
    """Latin keywords match whole words ("spec" is not in "specific"); CJK ones as substrings."""
    for w in words:
        if w.isascii():
            if re.search(rf"(?<![a-z0-9]){re.escape(w)}(?![a-z0-9])", q):
                return True
        elif w in q:
            return True
    return False


class ShopperError(RuntimeError):
    """The shopper backend failed (endpoint down, malformed reply); the message names the fix."""


class ConfirmationTracker:
    """Which requirements of a task the agent has asked about, read from its questions."""

    def __init__(self, task: Task, lang: str):
        self.task, self.lang = task, lang
        self.aspects: list[str] = [KIND, *([ATTRIBUTES] if task.attributes else []), PRICE, *task.options]
        self.confirmed: set[str] = set()

    def asked(self, question: str) -> list[str]:
        q = normalize(question)
        hits = [a for a in (KIND, ATTRIBUTES, PRICE) if a in self.aspects and _mentions(q, _ASPECT_WORDS[a])]
        generic_option = _mentions(q, _OPTION_WORDS)
        for axis in self.task.options:
            words = _AXIS_SYNONYMS.get(axis, (*_SIZE_WORDS, normalize(axis)))
            if generic_option or _mentions(q, (normalize(axis), *words)):
                hits.append(axis)
        if not hits and _mentions(q, _GENERIC):
            hits = [a for a in (KIND, ATTRIBUTES) if a in self.aspects]
        return hits

    def is_purchase_request(self, question: str) -> bool:
        q = normalize(question)
        return _mentions(q, _CONFIRM)

    def missing(self) -> list[str]:
        return [a for a in self.aspects if a not in self.confirmed]

    def missing_names(self) -> str:
        t = _TEXT[self.lang]
        return t["join"].join(t["names"].get(a, a) for a in self.missing())


class Shopper(Protocol):
    tracker: ConfirmationTracker

    def opening(self) -> str: ...

    def answer(self, question: str) -> str: ...

    def refusal(self) -> str: ...


class RuleShopper:
    """Deterministic shopper: keyword-matched questions, templated answers."""

    def __init__(self, task: Task, lang: str, persona: bool):
        self.task, self.lang, self.persona = task, lang, persona
        self.tracker = ConfirmationTracker(task, lang)

    def opening(self) -> str:
        return self.task.instruction_simple

    def _hidden(self, aspect: str) -> bool:
        return self.persona and self.task.hidden_aspect == aspect

    def answer(self, question: str) -> str:
        t, task = _TEXT[self.lang], self.task
        aspects = self.tracker.asked(question)
        if not aspects:
            if self.tracker.is_purchase_request(question):
                return self.refusal() if self.tracker.missing() else t["ok"]
            return t["unclear"].format(type=task.product_type.split()[-1] if self.lang == "en" else task.product_type)
        parts = []
        for a in aspects:
            self.tracker.confirmed.add(a)
            if a == KIND:
                parts.append(t["kind"].format(kind=task.product_type))
            elif a == ATTRIBUTES:
                atts = [x for x in task.attributes if not (self._hidden(ATTRIBUTES) and x == task.hidden_value)]
                if atts:
                    parts.append(t["attributes"].format(atts=t["join"].join(atts)))
                if self._hidden(ATTRIBUTES):
                    parts.append(t["usual"])
            elif self._hidden(a):
                parts.append(t["usual"])
            elif a == PRICE:
                parts.append(t["price"].format(price=task.price_upper))
            else:
                parts.append(t["option"].format(axis=a, value=task.options[a]))
        sep = " " if self.lang == "en" else ""
        return sep.join(dict.fromkeys(parts))

    def refusal(self) -> str:
        return _refusal(self.tracker)


def _refusal(tracker: ConfirmationTracker) -> str:
    return _TEXT[tracker.lang]["refuse"].format(missing=tracker.missing_names())


class OpenAIShopper:
    """A shopper played by any OpenAI-compatible chat endpoint (SGLang, vLLM, a hosted API).

    The model writes the replies; the `ConfirmationTracker` still decides, from the agent's
    questions, whether a purchase is premature, so enforcement does not depend on the model.
    """

    def __init__(self, task: Task, lang: str, persona: bool, config: ShopperConfig,
                 client: httpx.Client | None = None):
        self.task, self.lang, self.persona, self.config = task, lang, persona, config
        self.tracker = ConfirmationTracker(task, lang)
        self._client = client or httpx.Client(timeout=config.timeout_s)
        self._retry = RetryPolicy(attempts=config.max_retries + 1, backoff_s=0.2, max_backoff_s=5.0)
        self._messages = [{"role": "system", "content": self._system_prompt()}]

    def _system_prompt(self) -> str:
        task = self.task
        hidden = ""
        if self.persona and task.hidden_aspect:
            hidden = (
                f"\nIf asked about '{task.hidden_aspect}', reply only that it should be as you usually do "
                f"('{_TEXT[self.lang]['usual']}'), without giving the value."
            )
        language = "English" if self.lang == "en" else "Chinese"
        return (
            "You are a shopper talking to a shopping assistant. Your full need: "
            f"{task.instruction}\nThe options you want: {dict(task.options)}\n"
            "Rules: speak colloquially and briefly; give a detail only when the assistant asks about "
            "it; never reveal details that were not asked about; if the assistant wants to buy before "
            "it has asked about every requirement, refuse and name the missing kinds of information "
            f"(not their values). Reply in {language}.{hidden}"
        )

    def opening(self) -> str:
        return self.task.instruction_simple

    def answer(self, question: str) -> str:
        for a in self.tracker.asked(question):
            self.tracker.confirmed.add(a)
        self._messages.append({"role": "user", "content": question})
        reply = self._chat(self._messages)
        self._messages.append({"role": "assistant", "content": reply})
        return reply

    def refusal(self) -> str:
        # Templated, not generated: a refusal must name the missing categories, never values.
        return _refusal(self.tracker)

    def _chat(self, messages: list[dict[str, str]]) -> str:
        cfg = self.config
        url = cfg.base_url.rstrip("/") + "/chat/completions"
        headers = {}
        key = os.environ.get(cfg.api_key_env)
        if key:
            headers["Authorization"] = f"Bearer {key}"
        body = {"model": cfg.model, "messages": messages, "temperature": cfg.temperature}

        def post() -> str:
            r = self._client.post(url, json=body, headers=headers)
            if is_transient(r.status_code):
                raise Retryable(f"HTTP {r.status_code}")
            if r.status_code != 200:
                raise ShopperError(f"shopper endpoint {url} answered HTTP {r.status_code}: {r.text[:200]}")
            try:
                content = r.json()["choices"][0]["message"]["content"]
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise ShopperError(f"shopper endpoint {url} sent a malformed chat completion: {r.text[:200]}") from e
            if not isinstance(content, str) or not content.strip():
                raise ShopperError(f"shopper endpoint {url} sent an empty reply")
            return content.strip()

        try:
            return self._retry.call(post)
        except (httpx.TransportError, Retryable) as e:
            raise ShopperError(
                f"shopper endpoint {url} unreachable after {cfg.max_retries + 1} attempts ({e}); start an "
                "OpenAI-compatible server there or set shopper.backend='rule'"
            ) from e


def make_shopper(task: Task, lang: str, persona: bool, config: ShopperConfig) -> Shopper:
    if config.backend == "openai":
        return OpenAIShopper(task, lang, persona, config)
    return RuleShopper(task, lang, persona)
