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
    LlamaForCausalLM,
    ModelConfig,
    Qwen3_5ForCausalLM,
    Qwen3ForCausalLM,
    causal_lm_class,
    family_for_hf,
    get_family,
    hf_config,
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
    "llama": (ModelConfig.tiny_llama, LlamaForCausalLM, "llama", "json"),
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
    with pytest.raises(ValueError, match=r"Unknown model family 'mistral'; registered: \['llama', 'qwen3', 'qwen3_5'\]"):
        causal_lm_class(ModelConfig.tiny_qwen3(family="mistral"))
    with pytest.raises(ValueError, match="Unsupported model_type 'mistral'"):
        family_for_hf({"model_type": "mistral"})
    qwen3 = get_family("qwen3")
    with pytest.raises(ValueError, match="model_class Qwen3_5ForCausalLM is for family 'qwen3_5'"):
        dataclasses.replace(qwen3, model_class=Qwen3_5ForCausalLM)
    assert isinstance(qwen3, Family)


def test_full_attention_families_refuse_linear_layers_and_wrapped_saves(tmp_path):
    for cls in (Qwen3ForCausalLM, LlamaForCausalLM):
        linear = cls.family, ("linear_attention", "full_attention")
        with pytest.raises(ValueError, match=f"family '{cls.family}' has only 'full_attention' layers"):
            cls(ModelConfig.tiny_qwen3_5(family=linear[0], num_hidden_layers=2, layer_types=linear[1]),
                rngs=nnx.Rngs(0))
    config = ModelConfig.tiny_qwen3()
    model = Qwen3ForCausalLM(config, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="family 'qwen3' has no multimodal wrapper"):
        save_pretrained(model, tmp_path / "wrapped", hf_config={"text_config": hf_config(config)})
    assert not (tmp_path / "wrapped").exists()  # refused before anything is written


def test_the_model_modules_import_without_a_circle():
    """`models/config.py` sits below the families and `families.py` above them: no module of the
    package imports one that imports it back (the package `__init__`s only re-export)."""
    import ast
    import pathlib

    import intraskill_jax.models as package

    root = pathlib.Path(package.__file__).parent
    names = {".".join(("intraskill_jax.models", *p.relative_to(root).with_suffix("").parts)): p
             for p in root.rglob("*.py") if p.name != "__init__.py"}
    graph = {}
    for name, path in names.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("intraskill_jax.models"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    targets.add(full if full in names else node.module)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("intraskill_jax.models"))
        # a family package's __init__ stands for the family: follow it to its modules
        graph[name] = {t if t in names else f"{t}.model" for t in targets if t in names or f"{t}.model" in names}
    assert "intraskill_jax.models.families" not in graph["intraskill_jax.models.config"]

    def cycle_from(start):
        stack, seen = [(start, [start])], set()
        while stack:
            node, trail = stack.pop()
            for nxt in graph.get(node, ()):
                if nxt == start:
                    return trail + [nxt]
                if nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
        return None

    cycles = [c for c in (cycle_from(n) for n in graph) if c]
    assert not cycles, cycles[0]
