"""The family registry (`models/families.py`): every family round-trips through a saved
checkpoint, and the checkpoint's family alone sets the agent's tool-call format.

The expected class, `model_type` and tool-call format of each family are written out here by
hand, so a registration that pointed anywhere else fails."""

import dataclasses
import json

import numpy as np
import pytest
from flax import nnx
from transformers import AutoTokenizer

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.world import build_world

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.errors import ConfigError
from intraskill_jax.models import (
    FAMILIES,
    ModelConfig,
    Qwen3_5ForCausalLM,
    Qwen3ForCausalLM,
    causal_lm_class,
    family_for_hf,
    get_family,
    load_pretrained,
    save_pretrained,
)
from intraskill_jax.models.family import Family
from intraskill_jax.models.params import checkpoint_family
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.runconfig import RunConfig
from intraskill_jax.tokenization import IM_END, ToolCall, format_tool_calls, train_tokenizer

# (preset, family, model class, model_type written on save, tool-call format of its template)
CASES = {
    "qwen3_5": (ModelConfig.tiny_qwen3_5, Qwen3_5ForCausalLM, "qwen3_5_text", "xml"),
    "qwen3": (ModelConfig.tiny_qwen3, Qwen3ForCausalLM, "qwen3", "json"),
}
CORPUS = ["search for a blue latex pillow", "click buy now", "<tool_call> function name arguments"] * 20


def test_every_registered_family_is_covered_here():
    assert set(FAMILIES) == set(CASES)


@pytest.fixture(scope="module", params=list(CASES))
def checkpoint(request, tmp_path_factory):
    """(family name, HF directory: a tiny model of the family and a tokenizer writing its calls)."""
    name = request.param
    make, _, _, calls_as = CASES[name]
    tokenizer = train_tokenizer(CORPUS, vocab_size=300, tool_format=calls_as)
    config = make(vocab_size=len(tokenizer))
    model = causal_lm_class(config)(config, rngs=nnx.Rngs(0))
    directory = tmp_path_factory.mktemp(name)
    save_pretrained(model, directory)
    tokenizer.save_pretrained(directory)
    return name, directory, model


def test_a_saved_checkpoint_names_its_family_and_loads_as_it(checkpoint):
    name, directory, model = checkpoint
    _, cls, model_type, _ = CASES[name]
    assert type(model) is cls
    hf = json.loads((directory / "config.json").read_text())
    assert hf["model_type"] == model_type
    assert family_for_hf(hf) is get_family(name) is checkpoint_family(directory)
    assert get_family(name).model_class is cls
    loaded = load_pretrained(directory, dtype="float32")
    assert type(loaded) is cls and loaded.config == model.config
    ours = dict(nnx.to_flat_state(nnx.state(model, nnx.Param)))
    for path, var in nnx.to_flat_state(nnx.state(loaded, nnx.Param)):
        np.testing.assert_array_equal(np.asarray(var.get_value()), np.asarray(ours[path].get_value()))


@pytest.fixture(scope="module")
def world():
    return build_world(SimConfig(catalog=CatalogConfig(num_products=300),
                                 splits=SplitConfig(num_test=10, num_validation=10)))


def test_the_checkpoints_family_sets_the_agents_tool_calls(checkpoint, world):
    """No agent setting names the format: a Qwen3 checkpoint's agent reads JSON calls, a Qwen3.5
    checkpoint's XML calls, and replies in that format become actions, not repairs."""
    name, directory, _ = checkpoint
    calls_as = CASES[name][3]
    assert RunConfig().agent.tool_format is None
    agent = dataclasses.replace(RunConfig().for_policy(directory).agent, max_turns=2)
    assert agent.tool_format == calls_as
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    reply = format_tool_calls([ToolCall("search", {"keywords": "blue pillow"})], calls_as)
    engine = ScriptedEngine(lambda text: tokenizer.encode(text, add_special_tokens=False), lambda *_: reply,
                            tokenizer.convert_tokens_to_ids(IM_END))
    (traj,) = run_episodes(engine, [ShopEnv(world)], tokenizer, [EpisodeSpec(int(world.splits.test[0]))],
                           SamplingParams(max_new_tokens=64), agent)
    assert [(t.action, t.repair) for t in traj.turns] == [("search[blue pillow]", None)] * 2
    # The tokenizer's own template writes an assistant turn's calls in the same format.
    call = {"type": "function", "function": {"name": "search", "arguments": {"keywords": "blue pillow"}}}
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "hi"},
                                              {"role": "assistant", "content": "", "tool_calls": [call]}],
                                             tokenize=False)
    assert reply in rendered


def test_a_format_set_by_hand_must_match_the_checkpoint(checkpoint):
    name, directory, _ = checkpoint
    calls_as = CASES[name][3]
    other = "json" if calls_as == "xml" else "xml"
    assert RunConfig(agent=AgentConfig(tool_format=calls_as)).for_policy(directory).agent.tool_format == calls_as
    with pytest.raises(ConfigError, match=f"agent.tool_format='{other}'.*family '{name}'.*'{calls_as}'"):
        RunConfig(agent=AgentConfig(tool_format=other)).for_policy(directory)


def test_unknown_families_and_inconsistent_registrations_are_named():
    with pytest.raises(ValueError, match=r"Unknown model family 'llama'; registered: \['qwen3', 'qwen3_5'\]"):
        ModelConfig.tiny_qwen3(family="llama")
    with pytest.raises(ValueError, match="Unsupported model_type 'llama'"):
        family_for_hf({"model_type": "llama"})
    qwen3 = get_family("qwen3")
    with pytest.raises(ValueError, match="model_class Qwen3_5ForCausalLM is for family 'qwen3_5'"):
        dataclasses.replace(qwen3, model_class=Qwen3_5ForCausalLM)
    assert isinstance(qwen3, Family)


def test_full_attention_families_refuse_linear_layers_and_wrapped_saves(tmp_path):
    with pytest.raises(ValueError, match="family 'qwen3' has only 'full_attention' layers"):
        ModelConfig.tiny_qwen3(layer_types=("linear_attention", "full_attention"))
    config = ModelConfig.tiny_qwen3()
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="family 'qwen3' has no multimodal wrapper"):
        save_pretrained(model, tmp_path / "wrapped", hf_config={"text_config": config.to_hf_dict()})
    assert not (tmp_path / "wrapped").exists()  # refused before anything is written
