"""A `RolloutEngine` over SGLang's native HTTP API, with disk-based weight sync.

Works unchanged against a real SGLang server and against `intraskill serve`. Generation sends
token ids (`input_ids`) and reads `output_ids` and `meta_info.output_token_logprobs`
(`[logprob, token_id, text]`, log-probs of the temperature-scaled distribution), so nothing is
re-tokenised. Weight sync is SGLang's disk reload: pause generation (retracting running requests),
flush the radix cache (retried while requests drain), `update_weights_from_disk` with a
`weight_version`, continue: no request ever mixes two weight versions.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import httpx

from sim.retry import Retryable, RetryPolicy, is_transient

from intraskill_jax import distributed
from intraskill_jax.rollout.base import Completion, GenerateRequest, SamplingParams, WeightUpdate

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """The server is unreachable or answered something unusable; the message names the fix."""


class SGLangEngine:
    """A `RolloutEngine` client of an SGLang(-compatible) server. On several trainer processes
    process 0 alone talks to the server (`run_episodes` hands its episodes to the others)."""

    collective = False

    def __init__(self, base_url: str, *, timeout_s: float = 600.0, retries: int = 5, backoff_s: float = 0.5,
                 flush_retries: int = 60, client: httpx.Client | None = None):
        self.base_url = base_url.rstrip("/")
        self.flush_retries = flush_retries
        self._retry = RetryPolicy(attempts=retries + 1, backoff_s=backoff_s, max_backoff_s=10.0)
        self._client = client or httpx.Client(timeout=timeout_s)
        self.weight_version = 0

    # -- HTTP ------------------------------------------------------------------------------------

    def _post(self, path: str, body: dict[str, Any], *, retry_400: bool = False, retries: int | None = None) -> Any:
        """POSTs with the client's retries (or `retries` of them); `retry_400` also retries SGLang's
        400 "still running" answer to a flush."""
        url = self.base_url + path

        def once() -> Any:
            r = self._client.post(url, json=body)
            if is_transient(r.status_code) or (retry_400 and r.status_code == 400):
                raise Retryable(f"HTTP {r.status_code}: {r.text[:200]}")
            if r.status_code != 200:
                raise SGLangError(f"{url} answered HTTP {r.status_code}: {r.text[:300]}")
            try:
                return r.json()
            except ValueError as e:
                raise SGLangError(f"{url} answered non-JSON: {r.text[:200]}") from e

        policy = self._retry if retries is None else dataclasses.replace(self._retry, attempts=retries + 1)
        try:
            return policy.call(once)
        except httpx.TransportError as e:
            raise SGLangError(
                f"SGLang server at {self.base_url} is unreachable ({type(e).__name__}: {e}); start it "
                "(`python -m sglang.launch_server ...` or `intraskill serve`) or fix rollout.url"
            ) from e
        except Retryable as e:
            raise SGLangError(f"{url} kept failing after retries: {e}") from e

    def health(self) -> bool:
        try:
            return self._client.get(self.base_url + "/health").status_code == 200
        except httpx.TransportError:
            return False

    # -- RolloutEngine ---------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerateRequest], params: SamplingParams) -> list[Completion]:
        out: list[Completion] = []
        for req in requests:  # one session per request, so the server can keep each episode's cache
            body = {
                "input_ids": list(req.input_ids),
                "sampling_params": {
                    "temperature": params.temperature, "top_p": params.top_p,
                    "top_k": params.top_k if params.top_k > 0 else -1,
                    "max_new_tokens": params.max_new_tokens,
                    "stop_token_ids": list(params.stop_token_ids),
                    "skip_special_tokens": False, "no_stop_trim": True,
                },
                "return_logprob": True,
                "logprob_start_len": -1,
                "session_params": {"id": req.session},
            }
            out.append(self._parse(self._post("/generate", body)))
        return out

    def _parse(self, resp: Any) -> Completion:
        try:
            meta = resp["meta_info"]
            ids = [int(t) for t in resp["output_ids"]]
            pairs = meta["output_token_logprobs"]
            logprobs = [float(p[0]) for p in pairs]
            if [int(p[1]) for p in pairs] != ids:
                raise SGLangError("output_token_logprobs do not match output_ids; the server must not trim stop tokens")
            reason = meta["finish_reason"]["type"] if isinstance(meta.get("finish_reason"), dict) else "stop"
            version = int(meta.get("weight_version") or self.weight_version)
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise SGLangError(f"malformed /generate response from {self.base_url}: {str(resp)[:300]}") from e
        return Completion(ids, logprobs, "length" if reason == "length" else "stop", version)

    def release(self, session: str) -> None:
        try:
            self._post("/close_session", {"session_id": session}, retries=0)
        except SGLangError as e:  # a stock SGLang server has no such route; its radix cache evicts anyway
            log.debug("close_session: %s", e)

    def reseed(self, seed: int, step: int) -> None:
        """A no-op: the server samples from its own RNG and no per-request seed is sent, so replaying
        a step exactly after a resume holds for the embedded sampler only."""

    # -- weight sync -----------------------------------------------------------------------------

    def update_weights(self, weights: WeightUpdate) -> None:
        """Has the server load `weights.hf_dir()` (exported on this call if it is not on disk yet).
        The export is a collective on several processes; the server hears from process 0 alone."""
        path = weights.hf_dir()
        distributed.from_main(lambda: self.sync_weights(str(path), weights.version))
        self.weight_version = weights.version

    def sync_weights(self, model_path: str, weight_version: int) -> None:
        """Pause, flush (retried while requests drain), reload from disk, continue."""
        self._post("/pause_generation", {"mode": "retract"})
        try:
            self._post("/flush_cache", {}, retry_400=True, retries=self.flush_retries)
            resp = self._post("/update_weights_from_disk",
                              {"model_path": model_path, "weight_version": str(weight_version), "flush_cache": True})
            if isinstance(resp, dict) and resp.get("success") is False:
                raise SGLangError(f"server refused weights at {model_path}: {resp.get('message')}")
        finally:
            self._post("/continue_generation", {})
        self.weight_version = weight_version
