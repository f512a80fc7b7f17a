"""One retry policy for every HTTP client of the project: the simulator's (`sim.client`, the
OpenAI shopper) and the trainer's (the SGLang rollout client, the OpenAI analyst).

It lives in `sim/` because `sim` must never import the trainer while the trainer already imports
`sim`, so this is the one package both sides can share without breaking that layering.

A client says which exceptions mean "ask again" (transport errors, and `Retryable`, raised for
answers such as 429 or 5xx), how many attempts it makes and how long it backs off; tenacity does
the looping. Whatever error ends the last attempt is re-raised unchanged, so each client turns it
into its own message naming the URL and the fix.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import httpx
import tenacity

P = ParamSpec("P")
T = TypeVar("T")


class Retryable(Exception):
    """An answer worth asking for again (a 429, a 5xx, a full pool); the message says what came back."""


def is_transient(status_code: int) -> bool:
    """429 (rate limited) and 5xx (the server is struggling) may succeed on a later attempt."""
    return status_code == 429 or status_code >= 500


@dataclasses.dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Attributes:
      attempts: tries in all (1: no retry).
      backoff_s: the wait after the first failed try; each later wait doubles, up to max_backoff_s.
      max_backoff_s: the longest exponential wait.
      jitter_s: a uniform random extra in [0, jitter_s] on each wait, so many workers hitting one
        server do not retry in lockstep.
      retry_on: the exceptions that mean "try again"; any other one propagates at once.
      sleep: how a wait is spent (tests pass a recorder instead of sleeping).
    """

    attempts: int
    backoff_s: float
    max_backoff_s: float
    jitter_s: float = 0.0
    retry_on: tuple[type[BaseException], ...] = (httpx.TransportError, Retryable)
    sleep: Callable[[float], None] = time.sleep

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if min(self.backoff_s, self.max_backoff_s, self.jitter_s) < 0:
            raise ValueError(f"backoff_s, max_backoff_s and jitter_s must be >= 0, got "
                             f"{self.backoff_s}, {self.max_backoff_s}, {self.jitter_s}")

    def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """`fn(*args, **kwargs)`, tried up to `attempts` times while it raises one of `retry_on`; the
        last error is re-raised as it was. Each call has its own state, so one policy serves threads."""
        wait = tenacity.wait_exponential(multiplier=self.backoff_s, max=self.max_backoff_s)
        if self.jitter_s:
            wait = wait + tenacity.wait_random(0, self.jitter_s)
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.attempts), wait=wait,
            retry=tenacity.retry_if_exception_type(self.retry_on), sleep=self.sleep, reraise=True)
        return retrying(fn, *args, **kwargs)
