"""The run's policy: where it starts (a checkpoint or a fresh model), how it is loaded, how it plays.

`prepare_policy` gives the starting HF directory: `policy.path` (an HF directory, or a checkpoint
name, .gguf file or hub id that `models/acquire.py` turns into one), or a fresh Qwen3.5-architecture
model with a tokenizer trained on the simulator's text, saved under `<workdir>/base/` exactly as a
downloaded checkpoint would be. `load_policy` and `load_tokenizer` read the HF directories of a run
(`rundir.publish_policy` writes them), from gs:// through a local copy: the safetensors reader maps
local files and HF tokenizers read only local ones. `play` is how every stage of a run (the gate,
the evaluation) rolls the policy out on the shop: seeded, so the same call replays the same episodes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import jax
from etils import epath

from sim.env import ShopEnv
from sim.world import World

from intraskill_jax import rundir
from intraskill_jax.agent.episode import AgentConfig, SkillContext, run_groups
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.rollout.base import RolloutEngine, SamplingParams
from intraskill_jax.runconfig import RunConfig, resolve_repo_path
from intraskill_jax.skills.bank import SkillBank
from intraskill_jax.tokenization import ToolFormat

log = logging.getLogger(__name__)


def prepare_policy(config: RunConfig, workdir: rundir.PathLike, world: World) -> epath.Path:
    """The HF directory of the starting policy: `policy.path`, or a fresh model under `<workdir>/base/`.

    The fresh model is `ModelConfig.tiny_qwen3_5` under `policy.init` (a Qwen3.5-architecture
    network unless `init` names another family) with random weights and a byte-level BPE
    tokenizer trained on the simulator's text (titles, instructions, the skill bank, the tool
    prompt) whose template writes the family's tool calls, saved exactly as a downloaded
    checkpoint would be.
    """
    if config.policy.path:
        from intraskill_jax.models.acquire import resolve_checkpoint

        # a checkpoint name, .gguf file or hub id becomes a cached HF directory first
        path = rundir.run_path(resolve_checkpoint(config.policy.path, progress=True))
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"policy.path {path} has no config.json: point it at an HF checkpoint directory")
        return path
    base = rundir.base_policy_dir(workdir)
    if rundir.is_published(base):
        return base
    from flax import nnx

    from intraskill_jax.models import ModelConfig, get_family
    from intraskill_jax.tokenization import train_tokenizer

    model_config = ModelConfig.tiny_qwen3_5(**config.policy.init)
    family = get_family(model_config.family)
    tokenizer = train_tokenizer(_corpus(config, world, family.tool_format), config.policy.tokenizer_vocab_size,
                                tool_format=family.tool_format, template=config.policy.chat_template)
    model_config = model_config.replace(vocab_size=len(tokenizer))
    model = family.model_class(model_config, rngs=nnx.Rngs(config.train.seed))
    rundir.publish_policy(base, model, tokenizer)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    log.info("fresh policy (%d parameters, vocab %d) saved to %s", n_params, len(tokenizer), base)
    return base


def _corpus(config: RunConfig, world: World, tool_format: ToolFormat, episodes: int = 300) -> list[str]:
    """What the policy will read and write: prompts, skill text, oracle episodes' pages and calls
    (written in `tool_format`)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from sim.policies import OraclePolicy

    from intraskill_jax.agent.prompts import system_prompt
    from intraskill_jax.tokenization import SPECIAL_TOKENS, chat_template, format_tool_calls, from_env_action, tools_for

    lang, mode = config.sim.catalog.lang, config.sim.env.mode
    bank = SkillBank.load(resolve_repo_path(config.skills.initial))
    # The system turn (tool schema, instructions, skill) opens every episode: weight it like the
    # pages beside it. Special tokens are single ids already, so they are not corpus text.
    rendered, _ = render_jinja_template(
        [[{"role": "system", "content": system_prompt(lang, mode, bank.render(bank.full_mask(), lang))}]],
        tools=tools_for(mode), chat_template=chat_template(tool_format, config.policy.chat_template),
        add_generation_prompt=True)
    system = rendered[0]
    for token in SPECIAL_TOKENS:
        system = system.replace(token, "\n")
    texts = [system] * episodes
    env = ShopEnv(world)
    for tid in world.splits.train[:episodes]:
        result = env.reset(int(tid))
        policy = OraclePolicy()
        policy.reset(env, result.observation)
        texts.append(result.observation)
        while not result.done:
            action = policy.act(env, result.observation)
            texts.append(format_tool_calls([from_env_action(action)], tool_format))
            result = env.step(action)
            texts.append(result.observation)
    return texts


def default_mesh(config: RunConfig) -> Any:
    """The mesh a run shards over: `config.mesh` over every device of every process on an
    accelerator or on several processes; None (no sharding) on one CPU process, whose extra
    "devices" are test fakes or host threads that sharding would only slow down."""
    if jax.device_count() > 1 and (jax.default_backend() != "cpu" or jax.process_count() > 1):
        from intraskill_jax.models.sharding import make_mesh

        return make_mesh(config.mesh)
    return None


def load_policy(config: RunConfig, path: rundir.PathLike, mesh: Any = None) -> Any:
    from intraskill_jax.models.params import load_pretrained

    dtype = None if config.policy.dtype == "auto" else config.policy.dtype
    with rundir.local_dir(path) as local:
        return load_pretrained(local, mesh=mesh, dtype=dtype, **config.policy.model_overrides())


def load_tokenizer(path: rundir.PathLike, agent: AgentConfig) -> Any:
    """The HF tokenizer at `path`, its chat template checked against the agent loop's rendering
    under `agent` (tool-call format, thinking) before any rollout: raises ChatTemplateError if they differ."""
    from transformers import AutoTokenizer

    from intraskill_jax.tokenization import check_template

    with rundir.local_dir(path, skip=("*.safetensors",)) as local:
        tokenizer = AutoTokenizer.from_pretrained(str(local))
    check_template(tokenizer, tool_format=agent.tool_format, enable_thinking=agent.enable_thinking,
                   tool_style=agent.tool_preamble)
    return tokenizer


def play(engine: RolloutEngine, world: World, tokenizer: Any, config: RunConfig, task_ids: Sequence[int],
         contexts: Sequence[SkillContext], sampling: SamplingParams, *, prefix: str,
         seed: tuple[int, int], on_done: Callable[[int], None] | None = None) -> list[Trajectory]:
    """One episode per (task, context), seeded so the same call replays the same episodes;
    `on_done(n)` is told as episodes end (`agent.episode.run_episodes`)."""
    engine.reseed(*seed)
    return run_groups(engine, lambda: ShopEnv(world), tokenizer, task_ids, contexts, sampling, config.agent,
                      prefix=prefix, max_concurrent=config.rollout.capacity, on_done=on_done)
