"""ShopSimulator's HTTP service (`POST /api/shop_agent`) over one shared, read-only world.

The wire protocol is ShopSimulator's, kept so existing ShopSimulator clients work unchanged.
Every answer is `{"result": {...}}`.

    {"action": "reset", "idx": <task id>, "env_idx": <optional slot>}
        -> instruction, instruction_simple, goal_options, message "Task i started", env_idx, idx
           (+ user_persona, reason_key for persona tasks)
    {"action": "interact", "env_idx": k, "response": "<raw model text>"}
        -> done, reward, instruction (observation + the two affordance lines), message
           "Continue interaction", env_idx, idx, reward_detail, purchase, goal ({} until done),
           over (done, or the episode hit env.max_steps)
    {"action": "release_one", "env_idx": k} -> message "Environment k has been released" | "... is already free"
    {"action": "release_all"}               -> message "All environments have been initialized"

The action inside `response` is what follows the first "\\nAction: " up to the next one (upstream
`split("\\nAction: ")[1]`), else the whole text; a literal backslash-n is read as a newline first,
as upstream does. The reset answer repeats upstream's leak of `goal_options` and the persona: the
client must hide them from the policy. `reward` is the env's configured reward (`env.reward`:
'strict' by default; set 'loose' for upstream's value).

Departures from upstream, on purpose:
  * One shared World (catalog + index) for all slots; upstream built a catalog and index per slot.
  * Sessions are keyed by episode (the env_idx slot owns its own episode state), never by task id,
    so the same task on two slots cannot collide.
  * A bounded pool of `server.pool_size` slots that never leaks: a slot is freed when its episode is
    over, on release_one/release_all, on any exception while it is being reset or stepped, and when
    it has been idle longer than `server.session_ttl_s` (reaped lazily when a slot is acquired or
    stats are read). Freed slots are reused oldest-first, which keeps a late `release_one` from a
    client whose episode already ended (upstream clients release in `finally`) from hitting the
    next owner in all but a full pool's turnover.
  * A request without env_idx waits up to `server.acquire_timeout_s` for a slot (upstream: 5 x 5 s
    sleeps), then answers upstream's message "Unable to get available environment resource,
    please try again later" with HTTP 503 and a Retry-After header.
  * Errors keep upstream's envelope `{"result": {"error": "..."}}` but with real status codes
    (upstream answered 200): 400 body is not a JSON object, 404 unknown env_idx / task id / route,
    405 wrong method, 409 interact on a slot with no running episode, 413 body too large, 422 wrong
    field types, missing fields or unknown action, 500 internal error (the slot is freed), 503 pool
    exhausted.
  * `GET /health` reports the pool (size, free, busy, reaped, exhausted, errors) and the task count.
  * Binds 127.0.0.1 by default (upstream: 0.0.0.0).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import anyio.to_thread
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sim import render
from sim.config import ServerConfig, SimConfig
from sim.env import ShopEnv
from sim.protocol import API_PATH, NO_SLOT_MESSAGE, extract_action
from sim.world import World, build_world

log = logging.getLogger(__name__)

_DONE_FIELDS = ("reward_detail", "purchase", "goal")
MAX_BODY_BYTES = 4 * 1024 * 1024  # a model turn is a few KB; this only stops abuse
ACQUIRE_THREADS = 256  # resets waiting for a slot beyond this queue up and may wait past the timeout
WORK_THREADS = 32  # steps are CPU-bound under the GIL; more threads would only add switching


class ServiceError(Exception):
    """A request the service answers with an error status and `{"result": {"error": message}}`."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers


class ShopRequest(BaseModel):
    """The request body. Strict: "3" is not a task id and true is not a slot number."""

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    action: Literal["reset", "interact", "release_one", "release_all"]
    idx: int | None = None
    env_idx: int | None = None
    response: str | None = None


# -- the slot pool -----------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class Slot:
    """One environment and the episode it runs. `lock` serialises reset/step on it.

    `generation` changes whenever the slot changes hands, so a handler that finishes late frees the
    slot only if it still belongs to the episode the handler served.
    """

    index: int
    env: ShopEnv
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    busy: bool = False
    generation: int = 0
    last_used: float = 0.0


class SlotPool:
    """A fixed set of env slots; acquire waits for a free one, reaping abandoned episodes first."""

    def __init__(
        self,
        make_env: Callable[[], ShopEnv],
        size: int,
        ttl_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._slots = [Slot(index=i, env=make_env()) for i in range(size)]
        self._free: collections.deque[int] = collections.deque(range(size))
        self._cond = threading.Condition()
        self._ttl_s = ttl_s
        self._clock = clock
        self._counters = collections.Counter[str]()

    def __len__(self) -> int:
        return len(self._slots)

    def get(self, index: int) -> Slot:
        if not 0 <= index < len(self._slots):
            raise ServiceError(404, f"unknown env_idx {index}: slots are 0..{len(self._slots) - 1}")
        return self._slots[index]

    def acquire(self, timeout_s: float) -> tuple[Slot, int]:
        """Takes the longest-free slot; returns it with its new generation, or raises 503."""
        deadline = self._clock() + timeout_s
        with self._cond:
            while True:
                self._reap_locked()
                if self._free:
                    return self._take_locked(self._slots[self._free.popleft()])
                remaining = deadline - self._clock()
                if remaining <= 0:
                    self._counters["exhausted"] += 1
                    retry_after = str(max(1, round(timeout_s)))
                    raise ServiceError(503, NO_SLOT_MESSAGE, headers={"Retry-After": retry_after})
                self._cond.wait(remaining)

    def claim(self, index: int) -> tuple[Slot, int]:
        """Takes a named slot, free or not: a reset with env_idx restarts whatever ran there."""
        slot = self.get(index)
        with self._cond:
            if not slot.busy:
                self._free.remove(index)
            return self._take_locked(slot)

    def touch(self, slot: Slot, generation: int) -> None:
        with self._cond:
            if slot.generation == generation:
                slot.last_used = self._clock()

    def release(self, index: int, generation: int | None = None) -> bool:
        """Frees a slot; with `generation`, only if it still serves that episode. True if freed."""
        slot = self.get(index)
        with self._cond:
            if not slot.busy or (generation is not None and slot.generation != generation):
                return False
            self._free_locked(slot)
            return True

    def release_all(self) -> None:
        with self._cond:
            for slot in self._slots:
                if slot.busy:
                    self._free_locked(slot)

    def count(self, event: str) -> None:
        with self._cond:
            self._counters[event] += 1

    def stats(self) -> dict[str, int]:
        with self._cond:
            self._reap_locked()
            return {
                "size": len(self._slots),
                "free": len(self._free),
                "busy": len(self._slots) - len(self._free),
                "reaped": self._counters["reaped"],
                "exhausted": self._counters["exhausted"],
                "errors": self._counters["errors"],
            }

    def _take_locked(self, slot: Slot) -> tuple[Slot, int]:
        slot.busy = True
        slot.generation += 1
        slot.last_used = self._clock()
        return slot, slot.generation

    def _free_locked(self, slot: Slot) -> None:
        slot.busy = False
        slot.generation += 1
        self._free.append(slot.index)
        self._cond.notify()

    def _reap_locked(self) -> None:
        now = self._clock()
        for slot in self._slots:
            # A held lock means a request is running on the slot right now: not abandoned.
            if slot.busy and now - slot.last_used > self._ttl_s and not slot.lock.locked():
                log.info("reaping env %d: idle %.1fs > session_ttl_s", slot.index, now - slot.last_used)
                self._counters["reaped"] += 1
                self._free_locked(slot)


# -- the service -------------------------------------------------------------------------------


class ShopService:
    """The protocol, independent of HTTP: `handle(body) -> (status, result)`. Thread-safe."""

    def __init__(self, world: World, config: SimConfig):
        self.world = world
        self.config = config
        self.server_config: ServerConfig = config.server
        self.lang = world.catalog.lang
        self.num_tasks = len(world.catalog.tasks)
        self.pool = SlotPool(
            lambda: ShopEnv(world, config.env, config.shopper),
            config.server.pool_size,
            config.server.session_ttl_s,
        )

    def handle(self, body: bytes) -> dict[str, Any]:
        """Parses and serves one request body; raises ServiceError for anything it refuses."""
        return self.dispatch(self.parse(body))

    def dispatch(self, req: ShopRequest) -> dict[str, Any]:
        if req.action == "release_all":
            self.pool.release_all()
            return {"message": "All environments have been initialized"}
        if req.action == "release_one":
            index = self._require(req.env_idx, "env_idx", "release_one")
            if self.pool.release(index):
                return {"message": f"Environment {index} has been released"}
            return {"message": f"Environment {index} is already free"}
        if req.action == "reset":
            return self._reset(self._require(req.idx, "idx", "reset"), req.env_idx)
        index = self._require(req.env_idx, "env_idx", "interact")
        return self._interact(index, self._require(req.response, "response", "interact"))

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "tasks": self.num_tasks, "pool": self.pool.stats()}

    def parse(self, body: bytes) -> ShopRequest:
        try:
            data = json.loads(body)
        except (UnicodeDecodeError, ValueError) as e:
            raise ServiceError(400, f"request body is not valid JSON ({e}); send a JSON object") from None
        if not isinstance(data, dict):
            raise ServiceError(400, f"request body must be a JSON object, got {type(data).__name__}")
        try:
            return ShopRequest.model_validate(data)
        except ValidationError as e:
            raise ServiceError(422, "invalid request: " + _describe(e)) from None

    @staticmethod
    def _require(value: Any, field: str, action: str) -> Any:
        if value is None:
            raise ServiceError(422, f"action '{action}' needs the field '{field}'")
        return value

    def _reset(self, task_id: int, env_idx: int | None) -> dict[str, Any]:
        if not 0 <= task_id < self.num_tasks:
            raise ServiceError(404, f"task id {task_id} out of range: tasks are 0..{self.num_tasks - 1}")
        timeout = self.server_config.acquire_timeout_s
        slot, generation = self.pool.acquire(timeout) if env_idx is None else self.pool.claim(env_idx)
        try:
            with slot.lock:
                slot.env.reset(task_id)
                task = slot.env.task
            assert task is not None
            result: dict[str, Any] = {
                "instruction": task.instruction,
                "instruction_simple": task.instruction_simple,
                "goal_options": task.goal_options,
                "message": f"Task {task_id} started",
                "env_idx": slot.index,
                "idx": task_id,
            }
            if task.is_persona:
                result["user_persona"] = task.user_persona
                result["reason_key"] = task.reason_key
            return result
        except BaseException:
            self.pool.release(slot.index, generation)
            raise

    def _interact(self, index: int, response: str) -> dict[str, Any]:
        slot = self.pool.get(index)
        with slot.lock:
            generation = slot.generation
            env = slot.env
            if not slot.busy or env.done or env.task is None:
                raise ServiceError(
                    409,
                    f"environment {index} has no running episode (it finished, was released or "
                    "expired); send a reset first",
                )
            try:
                step = env.step(extract_action(response))
                available = env.available_actions()
                over = step.done or env.stats.steps >= env.config.max_steps
                result = {
                    "done": step.done,
                    "reward": step.reward,
                    "instruction": step.observation
                    + "\n\n"
                    + render.affordances(self.lang, available["has_search_bar"], available["clickables"]),
                    "message": "Continue interaction",
                    "env_idx": index,
                    "idx": env.task.task_id,
                    # Upstream sends these three on every step, empty until the episode is done.
                    **{k: (step.info.get(k) or {}) if step.done else {} for k in _DONE_FIELDS},
                    "over": over,
                }
            except BaseException:
                self.pool.release(index, generation)
                raise
        if over:
            self.pool.release(index, generation)
        else:
            self.pool.touch(slot, generation)
        return result


def _describe(error: ValidationError) -> str:
    parts = []
    for e in error.errors(include_url=False):
        where = ".".join(str(p) for p in e["loc"]) or "body"
        got = "" if e["type"] == "missing" else f" (got {json.dumps(e.get('input'))[:80]})"
        parts.append(f"field '{where}': {e['msg']}{got}")
    return "; ".join(parts)


# -- HTTP --------------------------------------------------------------------------------------


def _envelope(status: int, result: dict[str, Any], headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"result": result}, status_code=status, headers=headers)


async def _read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise ServiceError(413, f"request body of {declared} bytes exceeds {MAX_BODY_BYTES} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise ServiceError(413, f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(world: World, config: SimConfig | None = None) -> FastAPI:
    """The service over `world`; `config` defaults to the world's own (its env/shopper/server)."""
    config = config or world.config
    service = ShopService(world, config)
    app = FastAPI(title="IntraSkill ShopSimulator-compatible service", docs_url=None, redoc_url=None)
    app.state.service = service

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        return _envelope(exc.status, {"error": exc.message}, exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _envelope(exc.status_code, {"error": f"{request.method} {request.url.path}: {exc.detail}"})

    limiters: dict[str, anyio.CapacityLimiter] = {}

    def limiter(req: ShopRequest) -> anyio.CapacityLimiter:
        # Resets that may wait for a free slot get their own, larger set of worker threads (a
        # waiting thread only sleeps on the pool's condition), so a crowd of them can never starve
        # the steps and releases that would free the slots they wait for.
        kind = "acquire" if req.action == "reset" and req.env_idx is None else "other"
        if kind not in limiters:  # created lazily: a limiter belongs to the running event loop
            limiters[kind] = anyio.CapacityLimiter(
                max(ACQUIRE_THREADS, 4 * config.server.pool_size) if kind == "acquire" else WORK_THREADS
            )
        return limiters[kind]

    @app.post(API_PATH)
    async def shop_agent(request: Request) -> JSONResponse:
        req = service.parse(await _read_body(request))
        try:
            # Resets may wait for a slot and steps hold a per-slot lock: keep them off the event loop.
            result = await anyio.to_thread.run_sync(service.dispatch, req, limiter=limiter(req))
        except ServiceError:
            raise
        except Exception as exc:  # the handler already freed the slot it was serving
            service.pool.count("errors")
            log.exception("internal error while handling %s", API_PATH)
            return _envelope(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})
        return _envelope(200, result)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return service.health()

    return app


def serve(config: SimConfig) -> None:
    """Builds the world once and serves it until interrupted (`python -m sim serve`)."""
    import uvicorn

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    started = time.perf_counter()
    world = build_world(config, progress=True)
    log.info(
        "world ready in %.1fs: %d products, %d tasks; pool of %d envs",
        time.perf_counter() - started,
        len(world.catalog),
        len(world.catalog.tasks),
        config.server.pool_size,
    )
    log.info("serving POST http://%s:%d%s", config.server.host, config.server.port, API_PATH)
    uvicorn.run(create_app(world, config), host=config.server.host, port=config.server.port, log_level="info")
