"""SGLangEngine against `intraskill serve`'s app over real HTTP (a deterministic fake engine inside)."""

import threading
import time

import httpx
import pytest

from intraskill_jax.rollout.base import Completion, GenerateRequest, SamplingParams
from intraskill_jax.rollout.server import create_app
from intraskill_jax.rollout.sglang import SGLangEngine, SGLangError
from tests.http_util import free_port, serve_app


class EchoEngine:
    """Samples `n` tokens derived from the prompt and the weights; records sessions and reloads."""

    def __init__(self):
        self.weight_version = 0
        self.offset = 0
        self.released, self.loaded, self.calls = [], [], []
        self.delay = 0.0

    def generate(self, requests, params: SamplingParams):
        self.calls.append([r.session for r in requests])
        time.sleep(self.delay)
        out = []
        for r in requests:
            ids = [(sum(r.input_ids) + k + self.offset) % 97 for k in range(params.max_new_tokens)]
            stop = next((k for k, t in enumerate(ids) if t in params.stop_token_ids), None)
            reason = "length" if stop is None else "stop"
            ids = ids if stop is None else ids[: stop + 1]
            out.append(Completion(ids, [-0.5 * (k + 1) / params.temperature for k in range(len(ids))], reason, self.weight_version))
        return out

    def release(self, session):
        self.released.append(session)

    def reload(self, path):
        if "bad" in path:
            raise FileNotFoundError(f"no checkpoint at {path}")
        self.loaded.append(path)
        self.offset += 1


@pytest.fixture()
def served():
    engine = EchoEngine()
    with serve_app(create_app(engine, reload=engine.reload)) as url:
        yield engine, url


def test_generate_round_trips_ids_logprobs_and_sessions(served):
    engine, url = served
    client = SGLangEngine(url)
    params = SamplingParams(temperature=0.5, max_new_tokens=5, stop_token_ids=(96,))
    reqs = [GenerateRequest("ep-0", [1, 2, 3]), GenerateRequest("ep-1", [50, 40])]
    got = client.generate(reqs, params)
    want = engine.generate(reqs, params)
    assert [(c.token_ids, c.finish_reason, c.weight_version) for c in got] == [(c.token_ids, c.finish_reason, c.weight_version) for c in want]
    assert [c.logprobs for c in got] == [c.logprobs for c in want]  # exact: JSON round-trips float64
    assert ["ep-0"] in engine.calls and ["ep-1"] in engine.calls  # the episode is the server-side session
    client.release("ep-0")
    assert "ep-0" in engine.released


def test_weight_sync_reloads_and_tags_later_samples(served):
    engine, url = served
    client = SGLangEngine(url)
    before = client.generate([GenerateRequest("s", [7])], SamplingParams(max_new_tokens=3))[0]
    client.sync_weights("/ckpt/hf/weight_v000020", 20)
    after = client.generate([GenerateRequest("s", [7])], SamplingParams(max_new_tokens=3))[0]
    assert engine.loaded == ["/ckpt/hf/weight_v000020"]
    assert (before.weight_version, after.weight_version, client.weight_version) == (0, 20, 20)
    assert after.token_ids != before.token_ids
    assert httpx.get(url + "/get_weight_version").json() == {"weight_version": "20"}
    with pytest.raises(SGLangError, match="no checkpoint at /bad"):
        client.sync_weights("/bad", 21)
    assert client.weight_version == 20 and httpx.get(url + "/health").json()["paused"] is False


def test_flush_waits_for_running_requests(served):
    engine, url = served
    engine.delay = 0.6
    client = SGLangEngine(url, backoff_s=0.05)
    t = threading.Thread(target=client.generate, args=([GenerateRequest("slow", [1])], SamplingParams(max_new_tokens=2)))
    t.start()
    time.sleep(0.2)
    assert httpx.post(url + "/flush_cache").status_code == 400  # SGLang refuses while requests run
    client.sync_weights("/ckpt/v1", 1)  # retries the flush until the request drained
    t.join()
    assert engine.loaded == ["/ckpt/v1"]


@pytest.mark.parametrize(
    "body",
    [{"text": "hi"}, {"input_ids": []}, {"input_ids": [1, -2]}, {"input_ids": [[1], "x"]},
     {"input_ids": [1], "sampling_params": {"temperature": -1}}, {"input_ids": [1], "sampling_params": "hot"}],
)
def test_malformed_generate_is_400_with_a_message(served, body):
    _, url = served
    r = httpx.post(url + "/generate", json=body)
    assert r.status_code == 400 and r.json()["message"]


def test_raw_batch_generate_matches_sglang_response_shape(served):
    _, url = served
    r = httpx.post(url + "/generate", json={"input_ids": [[1, 2], [3]], "sampling_params": {"max_new_tokens": 2, "top_k": -1},
                                            "return_logprob": True}).json()
    assert isinstance(r, list) and len(r) == 2
    meta = r[0]["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 2
    assert [p[1] for p in meta["output_token_logprobs"]] == r[0]["output_ids"]


def test_dead_server_is_a_clear_error_fast():
    client = SGLangEngine(f"http://127.0.0.1:{free_port()}", retries=1, backoff_s=0.01)
    t0 = time.monotonic()
    with pytest.raises(SGLangError, match=r"127\.0\.0\.1.* is unreachable .*fix rollout\.url$"):
        client.generate([GenerateRequest("s", [1])], SamplingParams())
    assert time.monotonic() - t0 < 5 and client.health() is False
