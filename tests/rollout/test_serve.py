"""`intraskill serve` end to end: HF directory -> embedded sampler -> HTTP -> SGLangEngine, and
weight sync from disk with versions, against the in-process sampler."""

import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.models.params import save_pretrained
from intraskill_jax.rollout.base import GenerateRequest, SamplingParams
from intraskill_jax.rollout.jax_sampler import JaxSampler
from intraskill_jax.rollout.serve import build_app
from intraskill_jax.rollout.sglang import SGLangEngine, SGLangError
from intraskill_jax.tokenization import train_tokenizer
from tests.http_util import serve_app
from tests.rollout.tiny_models import SMALL


def checkpoint(path, seed, tok):
    cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tok))
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(seed))
    save_pretrained(model, path)
    tok.save_pretrained(path)
    return model


def test_serve_generates_like_the_sampler_and_hot_reloads(tmp_path):
    tok = train_tokenizer(["buy a latex pillow in blue, size 40x60cm"] * 20, vocab_size=300)
    m0 = checkpoint(tmp_path / "v0", 0, tok)
    m1 = checkpoint(tmp_path / "v1", 1, tok)
    prompt = tok.encode("buy a latex pillow", add_special_tokens=False)
    params = SamplingParams(temperature=0.0, max_new_tokens=6)
    want0 = JaxSampler(m0, SMALL).generate([GenerateRequest("x", prompt)], params)[0].token_ids
    want1 = JaxSampler(m1, SMALL).generate([GenerateRequest("x", prompt)], params)[0].token_ids
    assert want0 != want1
    with serve_app(build_app(str(tmp_path / "v0"), SMALL)) as url:
        client = SGLangEngine(url)
        assert client.generate([GenerateRequest("ep", prompt)], params)[0].token_ids == want0
        client.sync_weights(str(tmp_path / "v1"), 7)
        got = client.generate([GenerateRequest("ep", prompt)], params)[0]
        assert got.token_ids == want1 and got.weight_version == 7
        with pytest.raises(SGLangError, match="failed to load weights"):
            client.sync_weights(str(tmp_path / "missing"), 8)
        assert client.generate([GenerateRequest("ep", prompt)], params)[0].token_ids == want1  # old weights stay
        chat = client._client.post(url + "/v1/chat/completions",
                                   json={"messages": [{"role": "user", "content": "pillow"}], "max_tokens": 4}).json()
        assert chat["object"] == "chat.completion" and chat["usage"]["completion_tokens"] <= 4

