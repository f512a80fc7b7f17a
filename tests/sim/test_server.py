"""The ShopSimulator-compatible service, over real HTTP: protocol, pool, bad input, client."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.client import ShopClient, ShopServiceError
from sim.config import CatalogConfig, EnvConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.protocol import API_PATH, NO_SLOT_MESSAGE, extract_action
from sim.server import MAX_BODY_BYTES, create_app
from sim.world import World, build_world
from tests.http_util import free_port, serve_app

SMALL = SimConfig(catalog=CatalogConfig(num_products=1200), splits=SplitConfig(num_test=50, num_validation=50))
RESET_KEYS = {"instruction", "instruction_simple", "goal_options", "message", "env_idx", "idx"}
INTERACT_KEYS = {
    "done", "reward", "instruction", "message", "env_idx", "idx", "reward_detail", "purchase", "goal", "over",
}
REWARD_KEYS = {"r_type", "r_att", "r_option", "r_price", "loose", "strict", "success", "correct_product"}


@pytest.fixture(scope="module")
def world() -> World:
    return build_world(SMALL)


@contextlib.contextmanager
def serve(world: World, env: EnvConfig | None = None, **server: Any) -> Iterator[str]:
    """The real app under uvicorn in a background thread, on a free port; yields its base URL."""
    server = {"pool_size": 4, "acquire_timeout_s": 0.2, **server}
    config = dataclasses.replace(
        world.config, server=dataclasses.replace(world.config.server, port=0, **server), env=env or world.config.env
    )
    with serve_app(create_app(world, config)) as url:
        yield url


@pytest.fixture(scope="module")
def base(world: World) -> Iterator[str]:
    with serve(world, pool_size=6, acquire_timeout_s=0.5) as url:
        yield url


@pytest.fixture
def http(base: str) -> Iterator[httpx.Client]:
    """A raw HTTP client on the shared server; every test must leave its pool full."""
    with httpx.Client(base_url=base, timeout=30) as client:
        yield client
        pool = client.get("/health").json()["pool"]
        client.post(API_PATH, json={"action": "release_all"})
        assert pool["free"] == pool["size"], f"test left slots busy: {pool}"


def post(client: httpx.Client, payload: Any) -> tuple[int, dict[str, Any]]:
    """Posts and checks the envelope every answer must have."""
    r = client.post(API_PATH, json=payload)
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"result"} and isinstance(body["result"], dict), body
    if r.status_code != 200:
        assert isinstance(body["result"].get("error"), str) and body["result"]["error"], body
    return r.status_code, body["result"]


def ok(client: httpx.Client, payload: Any) -> dict[str, Any]:
    status, result = post(client, payload)
    assert status == 200, result
    return result


def pool(client: httpx.Client) -> dict[str, int]:
    return client.get("/health").json()["pool"]


def act(client: httpx.Client, env_idx: int, action: str, thought: str = "I should act.") -> dict[str, Any]:
    return ok(client, {"action": "interact", "env_idx": env_idx, "response": f"Thought: {thought}\nAction: {action}"})


def affordances(observation: str) -> tuple[bool, list[str]]:
    """Parses the two lines the service appends: (search available, clickable buttons)."""
    *_, search_line, click_line = observation.split("\n")
    return search_line.endswith("True"), json.loads(click_line.split(": ", 1)[1])


def buy_target(client: httpx.Client, world: World, env_idx: int, task_id: int) -> dict[str, Any]:
    """Drives an episode to `buy now` the way a careful agent would; returns the last answer."""
    task = world.catalog.tasks[task_id]
    step = act(client, env_idx, f"search[{task.title}]")
    _, clickables = affordances(step["instruction"])
    asin = task.asin if task.asin in clickables else next(c for c in clickables if c.isdigit())
    act(client, env_idx, f"click[{asin}]")
    product = world.catalog[world.catalog.index_of(asin)]
    for axis, values in product.options.items():
        wanted = task.options.get(axis)
        choice = wanted if wanted in [v.value for v in values] else values[0].value
        act(client, env_idx, f"click[{choice}]")
    return act(client, env_idx, "click[buy now]")


# -- protocol --------------------------------------------------------------------------------


def test_full_episode_reaches_done_with_reward_detail(http: httpx.Client, world: World) -> None:
    task_id = next(t.task_id for t in world.catalog.tasks if not t.is_persona)
    start = ok(http, {"action": "reset", "idx": task_id})
    task = world.catalog.tasks[task_id]
    assert set(start) == RESET_KEYS
    assert start["message"] == f"Task {task_id} started" and start["idx"] == task_id
    assert start["instruction"] == task.instruction and start["goal_options"] == task.goal_options
    assert pool(http)["busy"] == 1

    end = buy_target(http, world, start["env_idx"], task_id)
    assert set(end) == INTERACT_KEYS
    assert end["done"] is True and end["over"] is True and end["message"] == "Continue interaction"
    assert end["env_idx"] == start["env_idx"] and end["idx"] == task_id
    assert REWARD_KEYS <= set(end["reward_detail"])
    assert end["reward"] == end["reward_detail"]["strict"] == 1.0
    assert end["purchase"]["asin"] == task.asin and end["goal"]["asin"] == task.asin
    assert pool(http)["free"] == pool(http)["size"], "a finished episode frees its slot"
    status, late = post(http, {"action": "interact", "env_idx": start["env_idx"], "response": "click[buy now]"})
    assert status == 409 and "reset" in late["error"]


def test_interact_fields_before_done(http: httpx.Client) -> None:
    start = ok(http, {"action": "reset", "idx": 0})
    step = act(http, start["env_idx"], "search[pillow]")
    assert set(step) == INTERACT_KEYS
    assert step["done"] is False and step["over"] is False and step["reward"] == 0.0
    assert step["reward_detail"] == step["purchase"] == step["goal"] == {}
    assert "[SEP]" in step["instruction"]
    search, clickables = affordances(step["instruction"])
    assert search is False and clickables[0] == "back to search"
    ok(http, {"action": "release_one", "env_idx": start["env_idx"]})


def test_persona_reset_carries_profile(http: httpx.Client, world: World) -> None:
    task = next(t for t in world.catalog.tasks if t.is_persona)
    start = ok(http, {"action": "reset", "idx": task.task_id})
    assert set(start) == RESET_KEYS | {"user_persona", "reason_key"}
    assert start["reason_key"] == task.reason_key and start["user_persona"] == json.loads(json.dumps(task.user_persona))
    ok(http, {"action": "release_one", "env_idx": start["env_idx"]})


def test_action_extraction() -> None:
    assert extract_action("Thought: look\nAction: search[red pillow]") == "search[red pillow]"
    assert extract_action("search[red pillow]") == "search[red pillow]"
    assert extract_action("Thought: a\\nAction: click[buy now]") == "click[buy now]"  # literal \n, as upstream
    assert extract_action("T\nAction: click[a]\nAction: click[b]") == "click[a]"  # upstream split(...)[1]
    assert extract_action("Action: search[x]") == "Action: search[x]"  # the marker needs its newline


def test_action_extraction_over_http(http: httpx.Client) -> None:
    slot = ok(http, {"action": "reset", "idx": 1})["env_idx"]
    thought = ok(http, {"action": "interact", "env_idx": slot, "response": "Thought: hmm, search[x]?"})
    assert thought["instruction"].startswith("Invalid action") and affordances(thought["instruction"])[0] is True
    bare = ok(http, {"action": "interact", "env_idx": slot, "response": "search[pillow]"})
    assert affordances(bare["instruction"])[0] is False  # the whole text was the action
    escaped = "Thought: back\\nAction: click[back to search]"  # a literal backslash-n, as some clients send
    back = ok(http, {"action": "interact", "env_idx": slot, "response": escaped})
    assert affordances(back["instruction"])[0] is True
    ok(http, {"action": "release_one", "env_idx": slot})


def test_same_task_on_two_slots_is_independent(http: httpx.Client, world: World) -> None:
    a = ok(http, {"action": "reset", "idx": 7})["env_idx"]
    b = ok(http, {"action": "reset", "idx": 7})["env_idx"]
    assert a != b
    act(http, a, "search[pillow]")
    still_start = act(http, b, "click[back to search]")  # not clickable on b's start page
    assert still_start["instruction"].startswith("Invalid action") and affordances(still_start["instruction"])[0]
    end = buy_target(http, world, a, 7)
    assert end["done"] and end["env_idx"] == a
    assert act(http, b, "search[pillow]")["done"] is False  # b's episode survives a's end
    assert pool(http)["busy"] == 1
    ok(http, {"action": "release_one", "env_idx": b})


def test_reset_on_named_slot(http: httpx.Client) -> None:
    start = ok(http, {"action": "reset", "idx": 2, "env_idx": 3})
    assert start["env_idx"] == 3
    again = ok(http, {"action": "reset", "idx": 4, "env_idx": 3})  # restarts the episode on that slot
    assert again["env_idx"] == 3 and act(http, 3, "search[pillow]")["idx"] == 4
    assert pool(http)["busy"] == 1
    ok(http, {"action": "release_one", "env_idx": 3})


def test_release_one_and_release_all(http: httpx.Client) -> None:
    slots = [ok(http, {"action": "reset", "idx": i})["env_idx"] for i in range(3)]
    assert ok(http, {"action": "release_one", "env_idx": slots[0]}) == {
        "message": f"Environment {slots[0]} has been released"
    }
    assert ok(http, {"action": "release_one", "env_idx": slots[0]}) == {
        "message": f"Environment {slots[0]} is already free"
    }
    status, _ = post(http, {"action": "interact", "env_idx": slots[0], "response": "search[x]"})
    assert status == 409
    assert pool(http)["busy"] == 2
    assert ok(http, {"action": "release_all"}) == {"message": "All environments have been initialized"}
    assert pool(http)["busy"] == 0


def test_episode_over_at_max_steps_frees_slot(world: World) -> None:
    with serve(world, env=dataclasses.replace(SMALL.env, max_steps=3)) as url, httpx.Client(base_url=url) as http:
        slot = ok(http, {"action": "reset", "idx": 0})["env_idx"]
        answers = [act(http, slot, "click[nothing]") for _ in range(3)]
        assert [a["over"] for a in answers] == [False, False, True]
        assert answers[-1]["done"] and answers[-1]["reward"] == 0.0 and answers[-1]["purchase"] == {}
        assert pool(http)["busy"] == 0


# -- pool ------------------------------------------------------------------------------------


def test_pool_exhaustion_then_recovery(world: World) -> None:
    with serve(world, pool_size=2, acquire_timeout_s=1.0) as url, httpx.Client(base_url=url) as http:
        held = [ok(http, {"action": "reset", "idx": i})["env_idx"] for i in range(2)]
        r = http.post(API_PATH, json={"action": "reset", "idx": 5})
        assert r.status_code == 503 and r.json() == {"result": {"error": NO_SLOT_MESSAGE}}
        assert r.headers["retry-after"] == "1"
        assert pool(http)["exhausted"] == 1

        # A waiting reset gets the slot the moment another episode lets go of it.
        release = {"action": "release_one", "env_idx": held[0]}
        threading.Timer(0.2, lambda: httpx.post(url + API_PATH, json=release)).start()
        waited = ok(http, {"action": "reset", "idx": 5})
        assert waited["env_idx"] == held[0]
        ok(http, {"action": "release_all"})
        assert pool(http)["free"] == 2


def test_waiting_resets_do_not_starve_releases(world: World) -> None:
    """45 resets queued on a full pool must not block the release that would free it. (The waits
    time out after 6 s: a starved release comes after them, a prompt one well before, even on two
    busy cores; at 2 s a loaded machine failed it.)"""
    events: list[tuple[str, int]] = []
    with serve(world, pool_size=1, acquire_timeout_s=6.0) as url, httpx.Client(base_url=url, timeout=30) as http:
        held = ok(http, {"action": "reset", "idx": 0})["env_idx"]

        def waiter() -> None:
            r = http.post(API_PATH, json={"action": "reset", "idx": 1})
            events.append(("reset", r.status_code))

        threads = [threading.Thread(target=waiter) for _ in range(45)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        ok(http, {"action": "release_one", "env_idx": held})
        events.append(("release", 200))
        for t in threads:
            t.join(60)
        codes = [code for kind, code in events if kind == "reset"]
        assert codes.count(200) == 1 and codes.count(503) == 44
        first_refusal = next(i for i, (kind, code) in enumerate(events) if code == 503)
        assert events.index(("release", 200)) < first_refusal, "the release waited behind the resets"
        ok(http, {"action": "release_all"})


def test_handler_exception_frees_slot(http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    real_step, real_reset = ShopEnv.step, ShopEnv.reset

    def exploding_step(self: ShopEnv, action: str):
        if "boom" in action:
            raise RuntimeError("env exploded")
        return real_step(self, action)

    def exploding_reset(self: ShopEnv, task_id: int):
        if task_id == 13:
            raise RuntimeError("reset exploded")
        return real_reset(self, task_id)

    monkeypatch.setattr(ShopEnv, "step", exploding_step)
    monkeypatch.setattr(ShopEnv, "reset", exploding_reset)
    errors = pool(http)["errors"]
    slot = ok(http, {"action": "reset", "idx": 0})["env_idx"]
    act(http, slot, "search[pillow]")
    status, result = post(http, {"action": "interact", "env_idx": slot, "response": "search[boom]"})
    assert status == 500 and "env exploded" in result["error"]
    assert pool(http)["busy"] == 0
    assert post(http, {"action": "interact", "env_idx": slot, "response": "search[x]"})[0] == 409
    status, result = post(http, {"action": "reset", "idx": 13})
    assert status == 500 and "reset exploded" in result["error"]
    stats = pool(http)
    assert stats["busy"] == 0 and stats["errors"] == errors + 2


def test_abandoned_sessions_are_reaped(world: World) -> None:
    with serve(world, pool_size=2, session_ttl_s=0.5, acquire_timeout_s=0.1) as url, httpx.Client(base_url=url) as http:
        active = ok(http, {"action": "reset", "idx": 0})["env_idx"]
        abandoned = ok(http, {"action": "reset", "idx": 1})["env_idx"]
        act(http, active, "search[pillow]")
        for _ in range(5):  # steps keep `active` alive past the TTL; `abandoned` goes quiet
            time.sleep(0.15)
            act(http, active, "click[nothing]")
        fresh = ok(http, {"action": "reset", "idx": 2})
        assert fresh["env_idx"] == abandoned
        stats = pool(http)
        assert stats["reaped"] == 1 and stats["busy"] == 2
        assert post(http, {"action": "interact", "env_idx": active, "response": "click[< prev]"})[0] == 200
        time.sleep(0.6)
        stats = pool(http)  # reading stats reaps too
        assert stats["reaped"] == 3 and stats["free"] == 2
        assert post(http, {"action": "interact", "env_idx": active, "response": "click[< prev]"})[0] == 409


# -- bad input -------------------------------------------------------------------------------

JSON = {"content-type": "application/json"}
MALFORMED: list[tuple[str, bytes, dict[str, str], int]] = [
    ("not json", b'{"action":', JSON, 400),
    ("empty body", b"", JSON, 400),
    ("invalid utf-8", b'{"action": "reset", "idx": "\xff\xfe"}', JSON, 400),
    ("json list", b'[{"action": "reset", "idx": 0}]', JSON, 400),
    ("json string", b'"reset"', JSON, 400),
    ("json null", b"null", JSON, 400),
    ("nan", b'{"action": "reset", "idx": NaN}', JSON, 422),
    ("text/plain json is still read", b'{"action": "reset"}', {"content-type": "text/plain"}, 422),
    ("missing action", b'{"idx": 0}', JSON, 422),
    ("unknown action", b'{"action": "explode", "idx": 0}', JSON, 422),
    ("action wrong type", b'{"action": 3}', JSON, 422),
    ("action nested", b'{"action": {"reset": 1}}', JSON, 422),
    ("idx as string", b'{"action": "reset", "idx": "3"}', JSON, 422),
    ("idx as bool", b'{"action": "reset", "idx": true}', JSON, 422),
    ("idx as float", b'{"action": "reset", "idx": 1.5}', JSON, 422),
    ("reset without idx", b'{"action": "reset"}', JSON, 422),
    ("interact without env_idx", b'{"action": "interact", "response": "search[x]"}', JSON, 422),
    ("interact without response", b'{"action": "interact", "env_idx": 0}', JSON, 422),
    ("response as list", b'{"action": "interact", "env_idx": 0, "response": ["search[x]"]}', JSON, 422),
    ("env_idx as string", b'{"action": "release_one", "env_idx": "0"}', JSON, 422),
    ("release_one without env_idx", b'{"action": "release_one"}', JSON, 422),
    ("task id out of range", b'{"action": "reset", "idx": 1200}', JSON, 404),
    ("negative task id", b'{"action": "reset", "idx": -1}', JSON, 404),
    ("huge task id", b'{"action": "reset", "idx": 100000000000000000000000000000}', JSON, 404),
    ("unknown env_idx", b'{"action": "interact", "env_idx": 99, "response": "search[x]"}', JSON, 404),
    ("negative env_idx", b'{"action": "release_one", "env_idx": -1}', JSON, 404),
    ("reset on unknown env_idx", b'{"action": "reset", "idx": 0, "env_idx": 6}', JSON, 404),
    ("interact on a free slot", b'{"action": "interact", "env_idx": 0, "response": "search[x]"}', JSON, 409),
    ("body too large", b'{"action": "interact", "env_idx": 0, "response": "' + b"x" * MAX_BODY_BYTES + b'"}',
     JSON, 413),
]


@pytest.mark.parametrize(("body", "headers", "status"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_request_gets_4xx_json(http: httpx.Client, body: bytes, headers: dict[str, str], status: int) -> None:
    r = http.post(API_PATH, content=body, headers=headers)
    assert r.status_code == status, r.text
    error = r.json()["result"]["error"]
    assert isinstance(error, str) and len(error) > 10


@pytest.mark.parametrize(("method", "path", "status"), [("GET", API_PATH, 405), ("POST", "/nope", 404)])
def test_wrong_route_or_method_keeps_envelope(http: httpx.Client, method: str, path: str, status: int) -> None:
    r = http.request(method, path)
    assert r.status_code == status and r.json()["result"]["error"]


def test_error_messages_name_the_problem(http: httpx.Client) -> None:
    assert "idx" in post(http, {"action": "reset", "idx": "3"})[1]["error"]
    assert "explode" in post(http, {"action": "explode"})[1]["error"]
    assert "reset" in post(http, {"action": "explode"})[1]["error"]
    assert "0..1199" in post(http, {"action": "reset", "idx": 5000})[1]["error"]
    assert "0..5" in post(http, {"action": "interact", "env_idx": 6, "response": "x"})[1]["error"]


def test_concurrent_mixed_requests_leave_pool_full(world: World) -> None:
    """16 threads x 20 requests of resets, steps, releases and junk against an 8-slot pool."""
    failures: list[str] = []

    def worker(seed: int, url: str) -> None:
        rng = random.Random(seed)
        slot: int | None = None
        with httpx.Client(base_url=url, timeout=30) as http:
            for _ in range(20):
                kind = rng.choice(["reset", "reset", "step", "step", "step", "release", "junk"])
                if kind == "reset" or (kind == "step" and slot is None):
                    payload: Any = {"action": "reset", "idx": rng.choice([0, 1, 2, rng.randrange(1200)])}
                    if slot is not None:
                        payload["env_idx"] = slot
                elif kind == "step":
                    payload = {"action": "interact", "env_idx": slot, "response": rng.choice(
                        ["search[pillow]", "Thought: x\nAction: click[next >]", "click[back to search]", "junk"]
                    )}
                elif kind == "release":
                    payload = {"action": "release_one", "env_idx": slot if slot is not None else rng.randrange(8)}
                else:
                    payload = rng.choice([{"action": "nope"}, {"action": "reset", "idx": "1"}, [], {"idx": None}])
                r = http.post(API_PATH, json=payload)
                try:
                    result = r.json()["result"]
                    assert isinstance(result, dict)
                    assert r.status_code in (200, 400, 404, 409, 422, 503), r.status_code
                    assert (r.status_code == 200) == ("error" not in result)
                except (AssertionError, ValueError, KeyError) as e:
                    failures.append(f"{payload!r} -> {r.status_code} {r.text[:200]} ({e!r})")
                    continue
                action = payload.get("action") if isinstance(payload, dict) else None
                if r.status_code == 200 and action == "reset":
                    slot = result["env_idx"]
                elif action == "release_one" and payload["env_idx"] == slot:
                    slot = None
                elif r.status_code == 200 and result.get("over"):
                    slot = None
                elif r.status_code == 409:
                    slot = None
            if slot is not None:
                http.post(API_PATH, json={"action": "release_one", "env_idx": slot})

    with serve(world, pool_size=8, acquire_timeout_s=0.3) as url:
        threads = [threading.Thread(target=worker, args=(seed, url)) for seed in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stats = httpx.get(url + "/health").json()["pool"]
    assert not failures, failures[:5]
    assert stats["free"] == stats["size"] == 8 and stats["errors"] == 0


def adversarial_responses(n: int, seed: int = 0) -> Iterator[str]:
    """Random and hostile model turns: grammar near-misses, unicode, control chars, huge text."""
    rng = random.Random(seed)
    pieces = [
        "search[", "click[", "]", "[", "[[", "]]", "\nAction: ", "\\nAction: ", "Action:", "<|im_end|>",
        "<|im_start|>assistant", "</think>", "<tool_call>", "buy now", "next >", "< prev", "back to search",
        "search[search[x]]", "click[click[buy now]]", "\x00", "\x1b[31m", "\r\n", "\t", "\u202e", "\ufeff",
        "🛒", "枕头", "乳胶枕头", "ñ", "\ud7ff", "%s%n", "{}", '{"action": "reset"}', "null", "\\", "'", '"',
        "description", "features", "reviews", "pillow", "red", " " * 50,
    ]
    for i in range(n):
        roll = rng.random()
        if roll < 0.02:
            piece = rng.choice(pieces)
            yield piece * (rng.randrange(10_000, 500_000) // len(piece))  # huge, under the body limit
        elif roll < 0.1:
            depth = rng.randrange(1, 200)
            yield "search" + "[" * depth + "x" + "]" * rng.choice([depth, depth - 1, depth + 1])
        elif roll < 0.2:
            planes = [(0, 0x80), (0x80, 0xD800), (0xE000, 0x110000)]  # ASCII, BMP, the rest (no surrogates)
            yield "".join(chr(rng.randrange(*rng.choice(planes))) for _ in range(rng.randrange(0, 300)))
        else:
            yield "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 12)))


def test_fuzz_interact_with_adversarial_responses(world: World) -> None:
    """A few thousand hostile turns through one episode after another: always a well-formed step."""
    budget = time.monotonic() + 60
    with serve(world, pool_size=2) as url, httpx.Client(base_url=url, timeout=30) as http:
        slot = ok(http, {"action": "reset", "idx": 0})["env_idx"]
        episodes, sent = 1, 0
        for response in adversarial_responses(2000):
            if time.monotonic() > budget:
                break
            step = ok(http, {"action": "interact", "env_idx": slot, "response": response})
            sent += 1
            assert set(step) == INTERACT_KEYS and isinstance(step["instruction"], str)
            affordances(step["instruction"])
            if step["over"]:
                assert REWARD_KEYS <= set(step["reward_detail"])
                slot = ok(http, {"action": "reset", "idx": episodes % 1200})["env_idx"]
                episodes += 1
        ok(http, {"action": "release_all"})
        assert pool(http)["free"] == 2 and pool(http)["errors"] == 0
    assert sent >= 1000, f"only {sent} fuzz turns in the time budget"


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(response=st.text(max_size=400) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_hypothesis_responses_never_break_a_step(http: httpx.Client, response: str) -> None:
    slot = ok(http, {"action": "reset", "idx": 3})["env_idx"]
    step = ok(http, {"action": "interact", "env_idx": slot, "response": response})
    assert set(step) == INTERACT_KEYS
    if not step["over"]:
        ok(http, {"action": "release_one", "env_idx": slot})


# -- client ----------------------------------------------------------------------------------


def test_client_round_trip(base: str, world: World) -> None:
    with ShopClient(base, timeout=10, retries=1) as shop:
        assert shop.health()["tasks"] == len(world.catalog.tasks)
        start = shop.reset(11)
        slot = start["env_idx"]
        task = world.catalog.tasks[11]
        assert start["instruction"] == task.instruction
        step = shop.interact(slot, f"Thought: find it\nAction: search[{task.title}]")
        assert step["done"] is False and task.asin in step["instruction"]
        assert shop.release(slot)["message"] == f"Environment {slot} has been released"
        named = shop.reset(12, env_idx=2)
        assert named["env_idx"] == 2
        assert shop.release_all()["message"] == "All environments have been initialized"
        assert shop.health()["pool"]["busy"] == 0


def test_client_raises_clear_error_on_refusal(base: str) -> None:
    with ShopClient(base, retries=3) as shop:
        with pytest.raises(ShopServiceError, match="out of range") as info:
            shop.reset(10**6)
        assert info.value.status == 404 and info.value.url.endswith(API_PATH)
        with pytest.raises(ShopServiceError, match="409.*no running episode"):
            shop.interact(0, "search[x]")


def test_client_retries_until_a_slot_frees(world: World) -> None:
    with serve(world, pool_size=1, acquire_timeout_s=0.05) as url, ShopClient(url, retries=8, backoff=0.05) as shop:
        slot = shop.reset(0)["env_idx"]
        threading.Timer(0.3, shop.release, args=(slot,)).start()
        assert shop.reset(1)["env_idx"] == slot
        shop.release_all()
        with ShopClient(url, retries=1, backoff=0.01) as impatient:
            shop.reset(0)
            with pytest.raises(ShopServiceError, match="pool_size") as info:
                impatient.reset(1)
            assert info.value.status == 503


def test_client_fails_fast_and_clearly_when_server_is_down() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with ShopClient(url, timeout=2, retries=2, backoff=0.01) as shop:
        with pytest.raises(ShopServiceError) as info:
            shop.reset(0)
        with pytest.raises(ShopServiceError, match="cannot reach"):
            shop.health()
    message = str(info.value)
    assert url in message and "python -m sim serve" in message and "3 attempt" in message
    assert time.monotonic() - started < 5


# -- entry point -----------------------------------------------------------------------------


def test_python_m_sim_serve(tmp_path) -> None:
    port = free_port()
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cmd = [
        sys.executable, "-m", "sim", "serve", "--config=configs/sim.py", f"--config.server.port={port}",
        "--config.server.pool_size=3", "--config.catalog.num_products=1200",
        "--config.splits.num_test=50", "--config.splits.num_validation=50",
    ]
    log = open(tmp_path / "serve.log", "w")
    proc = subprocess.Popen(cmd, cwd=repo, stdout=log, stderr=subprocess.STDOUT)
    try:
        with ShopClient(f"http://127.0.0.1:{port}", retries=40, backoff=0.1, max_backoff=0.5) as shop:
            health = shop.health()
            assert health["pool"]["size"] == 3 and health["tasks"] == 1200
            assert shop.reset(4)["idx"] == 4
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


def test_client_import_stays_light() -> None:
    code = "import sys, sim.client; assert not {'jax', 'bm25s', 'fastapi', 'sim.world'} & set(sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_chinese_world_appends_chinese_affordance_lines(world_zh: World) -> None:
    with serve(world_zh) as url, httpx.Client(base_url=url) as http:
        task = world_zh.catalog.tasks[0]
        slot = ok(http, {"action": "reset", "idx": 0})["env_idx"]
        step = act(http, slot, f"search[{task.title}]", thought="搜索目标商品")
        search_line, click_line = step["instruction"].split("\n\n")[-1].split("\n")
        assert search_line == "搜索功能是否可用: False" and click_line.startswith("可点击的按钮: [")
        assert task.asin in json.loads(click_line.split(": ", 1)[1])
        ok(http, {"action": "release_one", "env_idx": slot})
