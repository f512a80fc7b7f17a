"""The engine named by `rollout.engine`, and the laziness of `WeightUpdate` it relies on."""

import typing
from pathlib import Path

import pytest
from flax import nnx

from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.rollout.base import WeightUpdate
from intraskill_jax.rollout.factory import ENGINES, make_engine
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from intraskill_jax.runconfig import RolloutConfig


class Counted:
    """A WeightUpdate whose two forms count how often they were made."""

    def __init__(self, version, model=None):
        self.loads, self.publishes = 0, 0
        self.weights = WeightUpdate(version=version, load_model=lambda: self._load(model), publish=self._publish)

    def _load(self, model):
        self.loads += 1
        return model

    def _publish(self):
        self.publishes += 1
        return Path("/runs/r/hf/weight_v000003")


def test_weight_update_makes_each_form_once_and_only_when_asked():
    c = Counted(3, model="the model")
    assert (c.loads, c.publishes) == (0, 0)
    assert c.weights.model() == c.weights.model() == "the model"
    assert (c.loads, c.publishes) == (1, 0)
    assert c.weights.hf_dir() == c.weights.hf_dir() == Path("/runs/r/hf/weight_v000003")
    assert (c.loads, c.publishes) == (1, 1)
    on_disk = WeightUpdate.published(4, "/ckpt/final", lambda: pytest.fail("nothing asked for the model"))
    assert on_disk.hf_dir() == Path("/ckpt/final") and on_disk.version == 4


def test_jax_engine_is_the_embedded_sampler_on_the_initial_model():
    cfg = ModelConfig.tiny_qwen3_5()
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    sampler = SamplerConfig(max_batch=2, max_length=64, min_cache_length=64)
    c = Counted(5, model)
    engine = make_engine(RolloutConfig(engine="jax", sampler=sampler), c.weights)
    assert isinstance(engine, JaxSampler) and engine.config == sampler and engine.weight_version == 5
    assert engine.model_config == cfg
    assert (c.loads, c.publishes) == (1, 0)  # the model in memory, never an export


def test_every_configurable_engine_is_registered():
    assert set(ENGINES) == set(typing.get_args(typing.get_type_hints(RolloutConfig)["engine"]))
