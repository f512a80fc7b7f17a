"""A Trace2Skill analyst over any OpenAI-compatible chat endpoint (SGLang, a hosted API,
`intraskill serve`).

The reply must be one JSON object (a ```json fence around it is tolerated):

    {"lessons": [{"title": str, "detail": str}, ...],                  # at most 3
     "patches": [{"op": "add" | "rewrite", "target": str | null,       # at most 3
                  "title": str, "en": str, "zh": str, "rationale": str}, ...]}

Anything else is rejected with a reason code (`malformed_json`, `schema`, `empty_reply`,
`http_status`, `http_error`) in the report, never raised: one bad reply must not end a round.
Transport errors, 429 and 5xx are retried with exponential backoff (`sim.retry`).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import httpx

from sim.retry import Retryable, RetryPolicy, is_transient

from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.skills.analysts import AnalystReport, Lesson, Patch, failure_classes
from intraskill_jax.skills.bank import SkillBank

log = logging.getLogger(__name__)

MAX_ITEMS = 3
_FENCE = re.compile(r"\A\s*```(?:json)?\s*\n(.*?)\n\s*```\s*\Z", re.DOTALL)
_LESSON_KEYS = {"title", "detail"}
_PATCH_KEYS = {"op", "target", "title", "en", "zh", "rationale"}

SYSTEM_PROMPT = """You analyse one episode of a shopping agent in a simulated online shop and improve \
its skill: a bank of short procedure chunks (one to four sentences each) that the agent may see in \
its prompt. Tools of the agent: search[keywords] on the search page; click[value] for a product id, \
an option value, 'buy now', 'next >', '< prev', 'back to search', 'description', 'features', \
'reviews'; ask_shopper[question] in conversations. A purchase succeeds only when the product type, \
every required attribute, every option and the price of the selected SKU (within the budget) are right.

Find what caused the outcome, then propose at most 3 minimal patches: rewrite an existing chunk \
(op "rewrite", target = its id) or add a new one (op "add", target null). Each patch gives the \
whole new chunk text in English (en) and Chinese (zh) with the same meaning. Lessons and patches must \
generalise to other tasks: never name the product, its id or the task's exact values. Plain text \
only, no markup.

Reply with exactly one JSON object and nothing else:
{"lessons": [{"title": "...", "detail": "..."}], "patches": [{"op": "add", "target": null, \
"title": "...", "en": "...", "zh": "...", "rationale": "..."}]}"""


class ReplyError(ValueError):
    """A reply that breaks the contract; `code` is the counted reason."""

    def __init__(self, code: str, detail: str):
        super().__init__(f"{code}: {detail}")
        self.code = code


def describe(trajectory: Trajectory) -> str:
    """The episode as the analyst reads it: outcome, reward components, stats, then each turn."""
    t = trajectory
    lines = [
        f"episode {t.episode_id}, task {t.task_id}: {'SUCCESS' if t.success else 'FAILURE'}",
        "reward: "
        + ", ".join(
            f"{k}={v:g}" for k, v in t.reward_detail.items() if isinstance(v, (int, float))
        ),
        "stats: " + ", ".join(f"{k}={v}" for k, v in t.env_stats.items()),
        f"truncated: {t.truncated}",
        f"taxonomy: {', '.join(failure_classes(t)) or 'none'}",
        "turns:",
    ]
    for i, turn in enumerate(t.turns, 1):
        if turn.repair is not None:
            lines.append(f"{i}. malformed reply: {turn.repair}")
        else:
            lines.append(
                f"{i}. {turn.tool}({json.dumps(turn.arguments or {}, ensure_ascii=False)}) -> {turn.action}"
            )
    return "\n".join(lines)


def describe_bank(bank: SkillBank) -> str:
    return (
        "\n".join(f"[{c.id}] {c.title}\n  en: {c.en}\n  zh: {c.zh}" for c in bank.active)
        or "(empty)"
    )


def parse_reply(
    content: str | None, trajectory_id: str
) -> tuple[tuple[Lesson, ...], tuple[Patch, ...]]:
    """Strictly parses a reply into lessons and patches; raises ReplyError with a reason code."""
    if content is None or not content.strip():
        raise ReplyError("empty_reply", "the reply has no content")
    m = _FENCE.match(content)
    text = m.group(1) if m else content
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ReplyError("malformed_json", str(e)) from None
    if not isinstance(doc, dict) or set(doc) != {"lessons", "patches"}:
        raise ReplyError("schema", "expected an object with exactly 'lessons' and 'patches'")
    lessons, patches = doc["lessons"], doc["patches"]
    if not isinstance(lessons, list) or not isinstance(patches, list):
        raise ReplyError("schema", "'lessons' and 'patches' must be lists")
    if len(lessons) > MAX_ITEMS or len(patches) > MAX_ITEMS:
        raise ReplyError("schema", f"at most {MAX_ITEMS} lessons and {MAX_ITEMS} patches")
    out_l = []
    for i, item in enumerate(lessons):
        _check_item(item, _LESSON_KEYS, f"lessons[{i}]")
        out_l.append(Lesson(item["title"], item["detail"]))
    out_p = []
    for i, item in enumerate(patches):
        where = f"patches[{i}]"
        _check_item(item, _PATCH_KEYS, where, nullable={"target"})
        if item["op"] not in ("add", "rewrite"):
            raise ReplyError("schema", f"{where}.op must be 'add' or 'rewrite', got {item['op']!r}")
        if (item["op"] == "rewrite") != (item["target"] is not None):
            raise ReplyError(
                "schema", f"{where}: a rewrite needs a target id and an add a null target"
            )
        out_p.append(
            Patch(
                item["op"],
                item["en"],
                item["zh"],
                item["title"],
                item["rationale"],
                (trajectory_id,),
                target=item["target"],
            )
        )
    return tuple(out_l), tuple(out_p)


def _check_item(
    item: Any, keys: set[str], where: str, nullable: frozenset[str] = frozenset()
) -> None:
    if not isinstance(item, dict) or set(item) != keys:
        raise ReplyError("schema", f"{where} must be an object with keys {sorted(keys)}")
    for k in keys:
        v = item[k]
        if not (isinstance(v, str) or (v is None and k in nullable)):
            raise ReplyError("schema", f"{where}.{k} must be a string")


class OpenAIAnalyst:
    """One chat completion per trajectory; thread-safe (one shared httpx.Client).

    Args:
      base_url: the endpoint's base, e.g. "http://localhost:30000/v1".
      model: the model name the endpoint serves.
      api_key: sent as a bearer token when given.
      client: an httpx.Client to use instead of a new one (tests pass a MockTransport).
      max_attempts: tries per trajectory for transport errors, 429 and 5xx.
      backoff_s: initial exponential backoff between tries.
      json_mode: ask for response_format json_object (SGLang and OpenAI support it).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        client: httpx.Client | None = None,
        timeout_s: float = 120.0,
        max_attempts: int = 3,
        backoff_s: float = 1.0,
        temperature: float = 0.3,
        max_tokens: int = 1536,
        json_mode: bool = True,
    ):
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.name = f"openai:{model}"
        self.model = model
        self.url = base_url.rstrip("/") + "/chat/completions"
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = client or httpx.Client(timeout=timeout_s)
        self.headers = headers
        self.max_attempts = max_attempts
        self._retry = RetryPolicy(attempts=max_attempts, backoff_s=backoff_s,
                                  max_backoff_s=30.0 * max(backoff_s, 1e-3))
        self.temperature, self.max_tokens, self.json_mode = temperature, max_tokens, json_mode

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        response = self.client.post(self.url, json=body, headers=self.headers)
        if is_transient(response.status_code):
            raise Retryable(f"HTTP {response.status_code}")
        if response.status_code != 200:
            raise ReplyError("http_status", f"HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except json.JSONDecodeError as e:
            raise ReplyError("malformed_json", f"response body: {e}") from None

    def analyse(self, trajectory: Trajectory, bank: SkillBank, lang: str) -> AnalystReport:
        tid = trajectory.episode_id
        body: dict[str, Any] = {
            "model": self.model,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
            "messages": [
                {"role": "system", "content": SYSTEM_PROMPT},
                {
                    "role": "user",
                    "content": f"Current skill chunks:\n{describe_bank(bank)}\n\nEpisode "
                    f"(language {lang}):\n{describe(trajectory)}",
                },
            ],
        }
        if self.json_mode:
            body["response_format"] = {"type": "json_object"}
        try:
            reply = self._retry.call(self._post, body)
            try:
                content = reply["choices"][0]["message"]["content"]
            except (KeyError, IndexError, TypeError):
                raise ReplyError(
                    "schema", "the response has no choices[0].message.content"
                ) from None
            lessons, patches = parse_reply(content, tid)
        except ReplyError as e:
            log.warning("analyst %s rejected the reply for %s: %s", self.name, tid, e)
            return AnalystReport(tid, trajectory.success, source=self.name, error=str(e))
        except (Retryable, httpx.HTTPError) as e:
            log.warning(
                "analyst %s gave up on %s after %d attempts: %s",
                self.name,
                tid,
                self.max_attempts,
                e,
            )
            code = "http_status" if isinstance(e, Retryable) else "http_error"
            return AnalystReport(tid, trajectory.success, source=self.name, error=f"{code}: {e}")
        return AnalystReport(tid, trajectory.success, lessons, patches, self.name)
