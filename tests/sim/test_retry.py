"""The shared retry policy: which errors it retries, how long it waits, and what it gives up with."""

import socket
import subprocess
import sys

import httpx
import pytest

from sim.retry import Retryable, RetryPolicy, is_transient


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Waits(list):
    """Records each wait instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


def flaky(statuses):
    """A client whose server answers `statuses` in turn; `.seen` counts the requests."""
    answers = iter(statuses)
    client = httpx.Client(transport=httpx.MockTransport(lambda request: httpx.Response(next(answers), json={"ok": 1})))
    client.seen = 0

    def get():
        client.seen += 1
        r = client.get("http://svc.test/x")
        if is_transient(r.status_code):
            raise Retryable(f"HTTP {r.status_code}")
        return r.status_code

    return client, get


def test_transient_answers_are_retried_with_doubling_waits():
    waits = Waits()
    client, get = flaky([503, 429, 200])
    assert RetryPolicy(attempts=4, backoff_s=0.5, max_backoff_s=10.0, sleep=waits).call(get) == 200
    assert client.seen == 3 and waits == [0.5, 1.0]  # 0.5 after the first failure, then doubled


def test_gives_up_after_the_attempts_with_the_last_error_and_waits_capped():
    waits = Waits()
    _, get = flaky([500, 502, 503, 504, 599])
    with pytest.raises(Retryable, match="HTTP 599"):
        RetryPolicy(attempts=5, backoff_s=1.0, max_backoff_s=3.0, sleep=waits).call(get)
    assert waits == [1.0, 2.0, 3.0, 3.0]  # 4 would exceed max_backoff_s


def test_other_errors_and_answers_are_not_retried():
    waits = Waits()
    client, get = flaky([404, 200])
    assert RetryPolicy(attempts=3, backoff_s=1.0, max_backoff_s=1.0, sleep=waits).call(get) == 404
    assert client.seen == 1 and waits == []
    with pytest.raises(ValueError, match="bad body"):
        RetryPolicy(attempts=3, backoff_s=1.0, max_backoff_s=1.0, sleep=waits).call(_raise, ValueError("bad body"))
    assert waits == []


def _raise(error):
    raise error


def test_jitter_adds_at_most_jitter_s_to_each_wait():
    waits = Waits()
    _, get = flaky([503] * 4)
    with pytest.raises(Retryable):
        RetryPolicy(attempts=4, backoff_s=0.5, max_backoff_s=10.0, jitter_s=0.25, sleep=waits).call(get)
    assert len(waits) == 3
    for wait, base in zip(waits, (0.5, 1.0, 2.0)):
        assert base <= wait <= base + 0.25


def test_a_dead_server_is_tried_every_attempt_then_its_connect_error_surfaces():
    waits, tries = Waits(), []
    url = f"http://127.0.0.1:{free_port()}/health"

    def get():
        tries.append(1)
        return httpx.get(url, timeout=2.0)

    with pytest.raises(httpx.ConnectError):
        RetryPolicy(attempts=3, backoff_s=0.01, max_backoff_s=1.0, sleep=waits).call(get)
    assert len(tries) == 3 and waits == [0.01, 0.02]


def test_a_policy_rejects_what_cannot_work():
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        RetryPolicy(attempts=0, backoff_s=1.0, max_backoff_s=1.0)
    with pytest.raises(ValueError, match="must be >= 0"):
        RetryPolicy(attempts=1, backoff_s=-1.0, max_backoff_s=1.0)


def test_the_helper_stays_on_the_simulator_side_of_the_layering():
    code = "import sys, sim.retry; assert not [m for m in sys.modules if m.startswith(('intraskill_jax', 'jax'))]"
    subprocess.run([sys.executable, "-c", code], check=True)
