import json

import httpx
import pytest

from sim.config import ShopperConfig
from sim.shopper import OpenAIShopper, RuleShopper, ShopperError, make_shopper


def _task(world, pred):
    return next(world.catalog.tasks[int(t)] for t in world.splits.test if pred(world.catalog.tasks[int(t)]))


def test_rule_shopper_tracks_confirmation_and_answers_purchase_requests(world):
    task = _task(world, lambda t: not t.is_persona and t.options)
    s = RuleShopper(task, world.catalog.lang, persona=False)
    assert s.opening() == task.instruction_simple
    buy = "Should I buy it?" if world.catalog.lang == "en" else "可以下单购买吗？"
    assert s.answer(buy) == s.refusal()
    everything = ("What type, what requirements, what budget, and which options?" if world.catalog.lang == "en"
                  else "什么类型？有什么要求？预算多少？规格选项呢？")
    reply = s.answer(everything)
    assert not s.tracker.missing()
    for value in task.options.values():
        assert value in reply
    assert s.answer(buy) in ("Yes, that's everything. Please buy it.", "对，就这些，帮我下单吧。")


def test_unclear_question_reveals_nothing(world_en):
    task = _task(world_en, lambda t: not t.is_persona)
    s = RuleShopper(task, "en", persona=False)
    reply = s.answer("hmm?")
    assert "not sure" in reply and all(a not in reply for a in task.attributes)
    assert set(s.tracker.missing()) == set(s.tracker.aspects)


def test_openai_shopper_speaks_chat_completions_and_keeps_history(world_en):
    task = _task(world_en, lambda t: t.is_persona)
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        assert request.url.path == "/v1/chat/completions"
        assert request.headers["authorization"] == "Bearer sk-test"
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": " blue please "}}]})

    cfg = ShopperConfig(backend="openai", base_url="http://shopper.test/v1", model="m", api_key_env="SHOPPER_KEY")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SHOPPER_KEY", "sk-test")
        s = OpenAIShopper(task, "en", True, cfg, client=httpx.Client(transport=httpx.MockTransport(handler)))
        assert s.answer("which color?") == "blue please"
        s.answer("what budget?")
    system = seen[0]["messages"][0]
    assert system["role"] == "system" and task.instruction in system["content"]
    assert "usually do" in system["content"]  # persona rule
    assert [m["role"] for m in seen[1]["messages"]] == ["system", "user", "assistant", "user"]
    assert seen[0]["model"] == "m"
    assert {"price"} <= s.tracker.confirmed


@pytest.mark.parametrize(
    "response, message",
    [
        (httpx.Response(200, text="not json"), "malformed"),
        (httpx.Response(200, json={"choices": []}), "malformed"),
        (httpx.Response(200, json={"choices": [{"message": {"content": "  "}}]}), "empty reply"),
        (httpx.Response(401, json={"error": "bad key"}), "HTTP 401"),
        (httpx.Response(503, text="busy"), "unreachable after 2 attempts"),
    ],
)
def test_openai_shopper_errors_are_clear(world_en, response, message):
    task = _task(world_en, lambda t: True)
    cfg = ShopperConfig(backend="openai", base_url="http://shopper.test/v1", max_retries=1)
    client = httpx.Client(transport=httpx.MockTransport(lambda r: response))
    with pytest.raises(ShopperError, match=message):
        OpenAIShopper(task, "en", False, cfg, client=client).answer("which color?")


def test_openai_shopper_dead_endpoint_fails_fast_with_the_fix(world_en):
    task = _task(world_en, lambda t: True)
    cfg = ShopperConfig(backend="openai", base_url="http://127.0.0.1:9/v1", max_retries=1, timeout_s=2.0)
    s = make_shopper(task, "en", False, cfg)
    with pytest.raises(ShopperError, match="shopper.backend='rule'"):
        s.answer("which color?")


def test_keywords_match_whole_words_only(world_en):
    task = _task(world_en, lambda t: not t.is_persona and "size" in t.options)
    s = RuleShopper(task, "en", persona=False)
    reply = s.answer("Do you have any specific requirements?")  # "spec" must not hit "specific"
    assert "size" not in s.tracker.confirmed and task.options["size"] not in reply
    assert "attributes" in s.tracker.confirmed
    s.answer("Which sizes and colors are available?")
    assert {"size", "color"} & set(task.options) <= s.tracker.confirmed
