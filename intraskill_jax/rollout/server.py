"""An SGLang-compatible HTTP server over any `RolloutEngine` (`intraskill serve`).

It speaks the subset of SGLang's native API that RL clients use, with SGLang's field names, so
`SGLangEngine` is tested end to end over real HTTP here and TPU users get hot weight reload (which
sglang-jax lacks) over the embedded JAX sampler:

    POST /generate                  input_ids (one list or a batch), sampling_params, return_logprob
    POST /update_weights_from_disk  {model_path, weight_version?, flush_cache?}
    POST /flush_cache               400 while requests run (as SGLang)
    POST /pause_generation, /continue_generation
    POST /close_session             {session_id}: drop an episode's cached state (extension)
    GET  /get_weight_version, /health
    POST /v1/chat/completions       OpenAI chat (needs a tokenizer with a chat template)

Sessions: a request may carry `session_params: {"id": ...}` (SGLang's session field); the engine
then keeps that episode's cache between turns. Without it, each request is its own session.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from intraskill_jax.rollout.base import GenerateRequest, RolloutEngine, SamplingParams

log = logging.getLogger(__name__)


class _State:
    def __init__(self, engine: RolloutEngine, reload: Callable[[str], None] | None):
        self.engine, self.reload = engine, reload
        self.lock = threading.Lock()  # engines are not thread-safe: one batch at a time
        self.running = 0
        self.count_lock = threading.Lock()
        self.unpaused = threading.Event()
        self.unpaused.set()


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"success": False, "message": message, "error": {"message": message}}, status_code=status)


def _sampling(raw: Any) -> SamplingParams:
    raw = raw or {}
    if not isinstance(raw, dict):
        raise ValueError("sampling_params must be an object")
    allowed = {"temperature", "top_p", "top_k", "max_new_tokens", "stop_token_ids"}
    kwargs = {k: raw[k] for k in allowed if k in raw and raw[k] is not None}
    if "top_k" in kwargs and kwargs["top_k"] < 0:  # SGLang's -1 means off
        kwargs["top_k"] = 0
    if "stop_token_ids" in kwargs:
        kwargs["stop_token_ids"] = tuple(int(t) for t in kwargs["stop_token_ids"])
    return SamplingParams(**kwargs)


def create_app(engine: RolloutEngine, *, tokenizer: Any = None, reload: Callable[[str], None] | None = None,
               model_name: str = "intraskill") -> FastAPI:
    """`reload(model_path)` loads an HF checkpoint into the engine in place (weight sync)."""
    app = FastAPI(title="intraskill serve (SGLang-compatible)")
    state = _State(engine, reload)

    def run(requests: list[GenerateRequest], params: SamplingParams):
        state.unpaused.wait()
        with state.count_lock:
            state.running += 1
        try:
            with state.lock:
                return state.engine.generate(requests, params)
        finally:
            with state.count_lock:
                state.running -= 1

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "weight_version": str(state.engine.weight_version), "paused": not state.unpaused.is_set()}

    @app.get("/get_weight_version")
    def get_weight_version() -> dict[str, Any]:
        return {"weight_version": str(state.engine.weight_version)}

    @app.post("/generate")
    async def generate(request: Request):
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "body is not JSON")
        if not isinstance(body, dict) or "input_ids" not in body:
            return _error(400, "this server takes token input: send input_ids (a list of ints or a list of lists)")
        ids = body["input_ids"]
        batch = bool(ids) and isinstance(ids[0], list)
        seqs = ids if batch else [ids]
        if not seqs or not all(isinstance(s, list) and s and all(isinstance(t, int) and t >= 0 for t in s) for s in seqs):
            return _error(400, "input_ids must be a non-empty list of non-negative ints (or a list of such lists)")
        try:
            params = _sampling(body.get("sampling_params"))
        except (TypeError, ValueError) as e:
            return _error(400, f"bad sampling_params: {e}")
        session = (body.get("session_params") or {}).get("id") if isinstance(body.get("session_params"), dict) else None
        if session is not None and batch:
            sessions = [f"{session}/{i}" for i in range(len(seqs))]
        else:
            sessions = [str(session) if session is not None else f"anon-{uuid.uuid4().hex}" for _ in seqs]
        t0 = time.perf_counter()
        completions = await anyio.to_thread.run_sync(run, [GenerateRequest(s, q) for s, q in zip(sessions, seqs)], params)
        if session is None:
            for s in sessions:
                state.engine.release(s)
        latency = time.perf_counter() - t0
        out = []
        for q, c in zip(seqs, completions):
            meta: dict[str, Any] = {
                "id": uuid.uuid4().hex,
                "finish_reason": {"type": c.finish_reason},
                "prompt_tokens": len(q),
                "completion_tokens": len(c.token_ids),
                "weight_version": str(c.weight_version),
                "e2e_latency": latency,
            }
            if body.get("return_logprob"):
                meta["output_token_logprobs"] = [[lp, tid, None] for lp, tid in zip(c.logprobs, c.token_ids)]
            text = tokenizer.decode(c.token_ids, skip_special_tokens=False) if tokenizer is not None else ""
            out.append({"text": text, "output_ids": c.token_ids, "meta_info": meta})
        return out if batch else out[0]

    @app.post("/close_session")
    async def close_session(request: Request):
        body = await request.json()
        sid = body.get("session_id") if isinstance(body, dict) else None
        if not isinstance(sid, str):
            return _error(400, "close_session needs {session_id: str}")
        state.engine.release(sid)
        return {"success": True, "message": f"session {sid} closed"}

    @app.post("/flush_cache")
    def flush_cache():
        if state.running:
            return _error(400, f"cannot flush the cache while {state.running} request(s) run; retry")
        return {"success": True, "message": "cache flushed"}

    @app.post("/pause_generation")
    def pause_generation():
        state.unpaused.clear()
        return {"success": True, "message": "paused"}

    @app.post("/continue_generation")
    def continue_generation():
        state.unpaused.set()
        return {"success": True, "message": "continued"}

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request):
        body = await request.json()
        if not isinstance(body, dict) or not isinstance(body.get("model_path"), str):
            return _error(400, "update_weights_from_disk needs {model_path: str}")
        if state.reload is None:
            return _error(400, "this server was started without a weight loader")
        def do_reload() -> None:
            with state.lock:  # waits for the batch in flight; new ones wait behind it
                assert state.reload is not None
                state.reload(body["model_path"])
                if body.get("weight_version") is not None:
                    state.engine.weight_version = int(body["weight_version"])

        try:
            await anyio.to_thread.run_sync(do_reload)
        except Exception as e:  # a bad checkpoint must not kill the server; the old weights stay
            log.exception("weight reload from %s failed", body["model_path"])
            return _error(400, f"failed to load weights from {body['model_path']}: {e}")
        return {"success": True, "message": f"loaded {body['model_path']}", "num_paused_requests": 0}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        if tokenizer is None:
            return _error(400, "this server was started without a tokenizer; chat completions need one")
        body = await request.json()
        messages = body.get("messages") if isinstance(body, dict) else None
        if not isinstance(messages, list) or not messages:
            return _error(400, "messages must be a non-empty list")
        try:
            ids = tokenizer.apply_chat_template(messages, tools=body.get("tools"), add_generation_prompt=True,
                                                tokenize=True, return_dict=False)
            params = SamplingParams(
                temperature=float(body.get("temperature", 1.0)), top_p=float(body.get("top_p", 1.0)),
                max_new_tokens=int(body.get("max_tokens") or body.get("max_completion_tokens") or 256),
                stop_token_ids=(tokenizer.eos_token_id,),
            )
        except Exception as e:
            return _error(400, f"bad chat request: {e}")
        session = f"chat-{uuid.uuid4().hex}"
        (c,) = await anyio.to_thread.run_sync(run, [GenerateRequest(session, ids)], params)
        state.engine.release(session)
        text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", model_name),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": c.finish_reason}],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": len(c.token_ids),
                      "total_tokens": len(ids) + len(c.token_ids)},
        }

    return app
