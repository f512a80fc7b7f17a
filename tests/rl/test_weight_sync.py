"""A learner step hands its new weights to each engine kind through `update_weights`: the embedded
sampler takes the model in memory (no export), the SGLang client has the project's own
SGLang-compatible server load the step's HF export, written once.

The untrained model never earns a reward on `CueEnv`, so no group would have reward variance;
every episode is admitted with advantages +1, -1, ... instead, since what is tested here is the
push of the updated weights, not what GRPO makes of the reward.
"""

import dataclasses

import httpx
import jax
import numpy as np
import pytest
from flax import nnx

from intraskill_jax import rundir
from intraskill_jax.agent.episode import AgentConfig
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.models.params import save_pretrained
from intraskill_jax.rl import learner as learner_lib
from intraskill_jax.rl.learner import Learner, TrainConfig
from intraskill_jax.rl.train_step import OptimConfig
from intraskill_jax.rollout.base import GenerateRequest, SamplingParams, WeightUpdate
from intraskill_jax.rollout.factory import make_engine
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from intraskill_jax.rollout.serve import build_app
from intraskill_jax.rollout.sglang import SGLangEngine
from intraskill_jax.runconfig import RolloutConfig
from intraskill_jax.tokenization import continuation_text, tools_for, train_tokenizer

from tests.http_util import serve_app
from tests.toys import CUES, PROMPT, CueEnv

AGENT = AgentConfig(tool_format="xml", max_turns=1, max_context_tokens=512, max_observation_chars=200,
                    show_affordances=False)
SAMPLER = SamplerConfig(max_batch=2, max_length=512, min_cache_length=512, prefill_buckets=(32, 128),
                        decode_buckets=(16,))
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=8)


@pytest.fixture(scope="module")
def tokenizer():
    texts = [system_prompt("en", "single"), str(tools_for("single")), continuation_text(tool_responses=["Done."])]
    return train_tokenizer((texts + [PROMPT.format(cue=c) for c in CUES]) * 50, vocab_size=400, template="compact")


@pytest.fixture
def every_episode_trains(monkeypatch):
    real = learner_lib.collect

    def collect(*args, **kw):
        exp = real(*args, **kw)
        n = len(exp.trajectories)
        return dataclasses.replace(exp, advantages=np.where(np.arange(n) % 2, -1.0, 1.0).astype(np.float32),
                                   admitted=np.ones(n, bool))

    monkeypatch.setattr(learner_lib, "collect", collect)


def tiny_model(tokenizer):
    cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tokenizer), num_hidden_layers=2,
                                   layer_types=("linear_attention", "full_attention"))
    return causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))


def one_step(model, tokenizer, engine, workdir):
    """A Learner that takes one step; a large learning rate so one update changes greedy output."""
    learner = Learner(model, tokenizer, engine, workdir, tasks=list(range(10)), make_env=CueEnv,
                      config=TrainConfig(rounds=1, gate_every=1, groups_per_step=1, group_size=2,
                                         optim=OptimConfig(learning_rate=0.05)),
                      sampling=SamplingParams(temperature=1.0, max_new_tokens=16), agent=AGENT)
    metrics = learner.train_step()
    learner.close()
    assert metrics["train/updated"] == 1.0 and learner.step == 1
    return learner


def greedy(engine, prompt):
    out = engine.generate([GenerateRequest("probe", prompt)], GREEDY)[0].token_ids
    engine.release("probe")
    return out


def test_embedded_sampler_takes_the_updated_model_in_memory_without_an_export(tokenizer, tmp_path,
                                                                             every_episode_trains):
    model = tiny_model(tokenizer)
    engine = JaxSampler(model, SAMPLER)
    prompt = tokenizer.encode(PROMPT.format(cue="red"), add_special_tokens=False)
    before = greedy(engine, prompt)
    learner = one_step(model, tokenizer, engine, tmp_path)
    assert engine.weight_version == 1
    updated = learner.model()
    for held, trained in zip(jax.tree.leaves(engine.state), jax.tree.leaves(nnx.state(updated)), strict=True):
        np.testing.assert_array_equal(np.asarray(held), np.asarray(trained))
    after = greedy(engine, prompt)
    assert after == greedy(JaxSampler(updated, SAMPLER), prompt)
    assert after != before  # the step did change the weights: the checks above can fail
    assert not (tmp_path / "hf").exists()  # an in-process engine never asks for the HF directory


def test_sglang_client_has_the_server_load_the_step_export_written_once(tokenizer, tmp_path, every_episode_trains,
                                                                       monkeypatch):
    model = tiny_model(tokenizer)
    base = tmp_path / "base"
    save_pretrained(model, base)
    tokenizer.save_pretrained(base)
    exports = []
    real_publish = rundir.publish_policy

    def counting_publish(out, m, tok, **kw):
        exports.append(out)
        return real_publish(out, m, tok, **kw)

    monkeypatch.setattr(rundir, "publish_policy", counting_publish)
    prompt = tokenizer.encode(PROMPT.format(cue="blue"), add_special_tokens=False)
    workdir = tmp_path / "run"
    with serve_app(build_app(str(base), SAMPLER)) as url:
        client = SGLangEngine(url)
        before = greedy(client, prompt)
        learner = one_step(model, tokenizer, client, workdir)
        assert exports == [workdir / "hf" / "weight_v000001"]
        assert [p.name for p in (workdir / "hf").iterdir()] == ["weight_v000001"]
        assert (workdir / "hf" / "weight_v000001" / "tokenizer.json").is_file()
        assert client.weight_version == 1
        assert httpx.get(url + "/get_weight_version").json() == {"weight_version": "1"}
        after = greedy(client, prompt)
    assert after == greedy(JaxSampler(learner.model(), SAMPLER), prompt)
    assert after != before


def test_a_new_sglang_engine_has_the_server_load_the_runs_starting_weights(tokenizer, tmp_path):
    """The server was launched on one checkpoint (`policy.path`); the run starts from another (the
    warm start's output): the engine the factory builds serves the run's, at its version."""
    launched, start = tmp_path / "launched", tmp_path / "sft_hf"
    for path, seed in ((launched, 0), (start, 1)):
        cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tokenizer), num_hidden_layers=2,
                                       layer_types=("linear_attention", "full_attention"))
        save_pretrained(causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(seed)), path)
        tokenizer.save_pretrained(path)
    prompt = tokenizer.encode(PROMPT.format(cue="red"), add_special_tokens=False)
    with serve_app(build_app(str(launched), SAMPLER)) as url:
        before = greedy(SGLangEngine(url), prompt)
        engine = make_engine(RolloutConfig(engine="sglang", url=url),
                             WeightUpdate.published(0, start, lambda: pytest.fail("a server client loads no model")))
        served = greedy(engine, prompt)
        assert httpx.get(url + "/get_weight_version").json() == {"weight_version": "0"}
    from intraskill_jax.models.params import load_pretrained

    assert served == greedy(JaxSampler(load_pretrained(start), SAMPLER), prompt)
    assert served != before  # the two checkpoints differ, so the check above can fail
