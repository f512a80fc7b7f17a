"""Client for the ShopSimulator protocol (ours in `sim.server`, or an upstream `pack_api.py`).

    with ShopClient("http://127.0.0.1:5000") as shop:
        start = shop.reset(task_id)                 # start["env_idx"] is this episode's slot
        step = shop.interact(start["env_idx"], "Thought: ...\\nAction: search[red pillow]")
        ...                                         # until step["over"]; the server frees the slot
        shop.release(start["env_idx"])              # only when abandoning an episode early

Retries (exponential backoff with jitter) cover what is safe to repeat: the connection was refused
or dropped before the request was sent, and "no free environment" answers (our 503; upstream's
HTTP 200 with that error message). Everything else fails at once with `ShopServiceError`; a step
is never resent, since the server may already have applied it.
"""

from __future__ import annotations

from typing import Any

import httpx

from sim.protocol import API_PATH, NO_SLOT_MESSAGE
from sim.retry import Retryable, RetryPolicy

START_HINT = "start one with `python -m sim serve --config=configs/sim.py` or pass the right base_url"


class ShopServiceError(RuntimeError):
    """The shop service failed or refused a request; the message names the URL and the fix."""

    def __init__(self, message: str, *, url: str, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


# Errors raised before the request left: resending cannot apply a step twice.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


class ShopClient:
    """Synchronous, thread-safe client (one pooled `httpx.Client`) for the trainer's rollouts.

    Args:
      base_url: the service root, e.g. "http://127.0.0.1:5000".
      timeout: seconds for each HTTP request (a reset may wait server-side for a free slot).
      retries: extra attempts on connection failures and a full pool (0 disables retrying).
      backoff: first wait in seconds; doubles each retry, with jitter, up to `max_backoff`.
    """

    def __init__(
        self,
        base_url: str = "http://127.0.0.1:5000",
        *,
        timeout: float = 60.0,
        retries: int = 5,
        backoff: float = 0.5,
        max_backoff: float = 10.0,
    ):
        if retries < 0:
            raise ValueError(f"retries must be >= 0, got {retries}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + API_PATH
        self.retries = retries
        self._http = httpx.Client(base_url=self.base_url, timeout=timeout)
        # Jitter keeps many rollout workers from retrying in lockstep against one pool; a full pool
        # is raised as `Retryable`.
        self._retry = RetryPolicy(attempts=retries + 1, backoff_s=backoff, max_backoff_s=max_backoff,
                                  jitter_s=backoff, retry_on=(*_NOT_SENT, Retryable))

    # -- protocol ------------------------------------------------------------------------------

    def reset(self, task_id: int, env_idx: int | None = None) -> dict[str, Any]:
        """Starts task `task_id` on a free slot (or on slot `env_idx`); the result names the slot."""
        payload: dict[str, Any] = {"action": "reset", "idx": task_id}
        if env_idx is not None:
            payload["env_idx"] = env_idx
        return self._call(payload)

    def interact(self, env_idx: int, response: str) -> dict[str, Any]:
        """Sends one raw model turn; the env acts on the text after "\\nAction: " (or on all of it)."""
        return self._call({"action": "interact", "env_idx": env_idx, "response": response})

    def release(self, env_idx: int) -> dict[str, Any]:
        """Frees slot `env_idx`; needed only for an episode abandoned before it was over."""
        return self._call({"action": "release_one", "env_idx": env_idx})

    def release_all(self) -> dict[str, Any]:
        """Frees every slot, including other clients' running episodes."""
        return self._call({"action": "release_all"})

    def health(self) -> dict[str, Any]:
        url = self.base_url + "/health"
        try:
            response = self._retry.call(self._http.get, "/health")
        except _NOT_SENT as e:
            raise self._unreachable(url, e) from e
        except httpx.HTTPError as e:
            raise ShopServiceError(f"{url}: {type(e).__name__}: {e}", url=url) from e
        if response.status_code != 200:
            raise ShopServiceError(f"{url} answered HTTP {response.status_code}: {response.text[:300]}", url=url)
        return response.json()

    # -- plumbing ------------------------------------------------------------------------------

    def _call(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._retry.call(self._post, payload)
        except _NOT_SENT as e:
            raise self._unreachable(self.url, e) from e
        except Retryable as e:
            raise ShopServiceError(
                f"{self.url}: {e} (still no free environment after {self.retries + 1} attempts); "
                "raise the server's server.pool_size or lower the client's concurrency",
                url=self.url,
                status=503,
            ) from None
        except httpx.TimeoutException as e:
            raise ShopServiceError(
                f"{self.url}: no answer to '{payload['action']}' within the timeout ({type(e).__name__}); "
                "the server is overloaded or stuck: check its log, or raise the client timeout",
                url=self.url,
            ) from e
        except httpx.HTTPError as e:
            raise ShopServiceError(f"{self.url}: {type(e).__name__}: {e}", url=self.url) from e

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        response = self._http.post(API_PATH, json=payload)
        try:
            result = response.json()["result"]
            error = result.get("error") if isinstance(result, dict) else None
        except (ValueError, KeyError, TypeError):
            raise ShopServiceError(
                f"{self.url} answered HTTP {response.status_code} without a {{'result': ...}} JSON body: "
                f"{response.text[:300]!r}; is base_url a ShopSimulator service?",
                url=self.url,
                status=response.status_code,
            ) from None
        if response.status_code == 503 or (error and NO_SLOT_MESSAGE in str(error)):
            raise Retryable(str(error or NO_SLOT_MESSAGE))
        if error is not None or response.status_code != 200:
            raise ShopServiceError(
                f"{self.url} refused '{payload['action']}' (HTTP {response.status_code}): {error}",
                url=self.url,
                status=response.status_code,
            )
        return result

    def _unreachable(self, url: str, error: Exception) -> ShopServiceError:
        return ShopServiceError(
            f"cannot reach the shop service at {url} after {self.retries + 1} attempt(s) "
            f"({type(error).__name__}: {error}); {START_HINT}",
            url=url,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ShopClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
