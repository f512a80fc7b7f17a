"""What the GRPO learning tests share (tests/rl/test_learning.py, test_learning_multiturn.py): a
tokenizer for the toy worlds of tests/toys.py, a tiny policy warm-started by SFT on noisy scripted
demonstrations, its held-out success, and a run of the real Learner on it.

Everything but the policy's first choices is the trainer's own: the embedded JAX sampler, the
episode runner and its loss masks, group collection and advantages, the jitted GRPO step, the
weight push.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from intraskill_jax.agent.episode import AgentConfig, EpisodeSpec, run_episodes
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.metrics import read_metrics
from intraskill_jax.models import ModelConfig, causal_lm_class
from intraskill_jax.rl import learner as learner_lib
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rl.learner import Learner, TrainConfig
from intraskill_jax.rl.sft import SFTConfig, run_sft
from intraskill_jax.rl.train_step import OptimConfig
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.rollout.jax_sampler import JaxSampler, SamplerConfig
from intraskill_jax.tokenization import IM_END, ToolCall, continuation_text, format_tool_calls, tools_for, train_tokenizer

from tests.toys import ANSWERS, CONFIRM, CUES, LOOK_PROMPT, PROMPT

TRAIN_TASKS = list(range(1000))
HELD_OUT = list(range(1000, 1128))


def click(value: str) -> str:
    return format_tool_calls([ToolCall("click", {"value": value})], "xml")


def toy_tokenizer():
    """A BPE tokenizer over the toy worlds' prompt, pages, tool responses and calls."""
    texts = [system_prompt("en", "single"), str(tools_for("single")), LOOK_PROMPT]
    texts += [continuation_text(tool_responses=[page]) for page in ("Done.", CONFIRM, *(PROMPT.format(cue=c) for c in CUES))]
    texts += [PROMPT.format(cue=c) for c in CUES] + [click(v) for v in ("left", "right", "look", "confirm")]
    return train_tokenizer(texts * 50, vocab_size=400, template="compact")


@dataclasses.dataclass(frozen=True)
class Setting:
    """One learning test: its world, episode limits, sampling and updates per batch."""

    make_env: Callable[[], Any]
    agent: AgentConfig
    sampling: SamplingParams
    updates_per_batch: int
    learning_rate: float


def scripted(tokenizer, script: Callable[[str, list[int]], str]) -> ScriptedEngine:
    return ScriptedEngine(lambda s: tokenizer.encode(s, add_special_tokens=False), script,
                          tokenizer.convert_tokens_to_ids(IM_END))


def play(engine, tokenizer, setting: Setting, tasks: Sequence[int], prefix: str) -> list[Trajectory]:
    specs = [EpisodeSpec(t, group=i) for i, t in enumerate(tasks)]
    return run_episodes(engine, [setting.make_env() for _ in specs], tokenizer, specs, setting.sampling,
                        setting.agent, episode_prefix=prefix, max_concurrent=64)


def noisy_side(task: int, rng: np.random.Generator, accuracy: float) -> str:
    """The side a demonstrator clicks for task `task`: the right one `accuracy` of the time."""
    from tests.toys import cue_of

    right = ANSWERS[cue_of(task)]
    wrong = next(s for s in ANSWERS.values() if s != right)
    return right if rng.random() < accuracy else wrong


def warm_policy(tokenizer, setting: Setting, reply: Callable[[int, str, np.random.Generator], str], *,
                demos: int = 256, epochs: int = 8) -> tuple[nnx.State, ModelConfig]:
    """A tiny hybrid policy after SFT on `demos` scripted episodes, `reply(task, prompt text, rng)`
    writing each turn's reply."""
    rng = np.random.default_rng(0)
    tasks = TRAIN_TASKS[:demos]

    def script(session: str, ids: list[int]) -> str:
        return reply(tasks[int(session.rsplit("-", 1)[1])], tokenizer.decode(ids), rng)

    trajs = play(scripted(tokenizer, script), tokenizer, setting, tasks, "demo")
    cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tokenizer), num_hidden_layers=2,
                                   layer_types=("linear_attention", "full_attention"))
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    run_sft(model, trajs, SFTConfig(optim=OptimConfig(learning_rate=5e-3, warmup_steps=5), batch_size=16,
                                    epochs=epochs), pad_id=tokenizer.pad_token_id, progress=False)
    return nnx.state(model), cfg


def success(engine, tokenizer, setting: Setting, seed: int = 1) -> float:
    """Held-out success: 128 tasks no step trains on, sampled at the setting's temperature."""
    engine.reseed(seed, 10**6)
    return float(np.mean([t.success for t in play(engine, tokenizer, setting, HELD_OUT, "held")]))


@dataclasses.dataclass(frozen=True)
class Run:
    before: float  # held-out success of the warm start, measured
    after: float  # held-out success after the last step
    rows: list[dict[str, Any]]  # the run's metrics.jsonl

    def mean(self, key: str, steps: range) -> float:
        return float(np.mean([r[key] for r in self.rows if r["step"] in steps and key in r]))


# Warmup, a tight clip, a second moment that follows the gradient within ~100 updates and a cosine
# decay keep one gradient spike from wrecking the reply format. Without the first three, at 1e-3
# on one 2-core machine, a spike at step 3 (norm 0.2 -> 3.0) made every later reply malformed
# (success 0.59 -> 0.00); with them at a constant 1e-3, one at step 38 of 40 did the same once
# the policy was saturated (rollouts 0.94-0.97, a step's admitted groups down to one or two, so
# one update follows a handful of episodes): an absorbing state, every later group zero-variance.
def train(tokenizer, warm: tuple[nnx.State, ModelConfig], setting: Setting, workdir, steps: int, *,
          on_step: Callable[[int, Any], dict[str, float]] | None = None) -> Run:
    """`steps` GRPO steps of the real Learner from the warm start; held-out success before and after.
    The learning rate decays over the `steps`. `on_step(step, experience)` sees each
    step's episodes before its update (`Learner`'s hook)."""
    state, cfg = warm
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(1))
    nnx.update(model, jax.tree.map(jnp.copy, state))  # the update donates its buffers; keep the fixture's
    engine = JaxSampler(model, SamplerConfig(max_batch=64, max_length=512, min_cache_length=256,
                                             prefill_buckets=(32, 128), decode_buckets=(32,)))
    before = success(engine, tokenizer, setting)
    optim = OptimConfig(learning_rate=setting.learning_rate, warmup_steps=3, grad_clip=0.5, b2=0.99,
                        micro_batch_size=16, schedule="cosine", min_lr_ratio=0.1,
                        total_steps=steps * setting.updates_per_batch)
    learner = Learner(model, tokenizer, engine, workdir, tasks=TRAIN_TASKS, make_env=setting.make_env,
                      config=TrainConfig(rounds=1, gate_every=steps, checkpoint_every=steps, groups_per_step=8,
                                         group_size=8, updates_per_batch=setting.updates_per_batch, optim=optim,
                                         loss=LossConfig()),
                      sampling=setting.sampling, agent=setting.agent, on_step=on_step)
    while learner.step < steps:
        learner.train_step()
    learner.close()
    return Run(before, success(engine, tokenizer, setting), read_metrics(workdir))


@pytest.fixture
def shared_programs(monkeypatch):
    """The runs of a test share one compiled update and log-prob program (same graph and configs)."""
    made = {}
    real_update, real_logprobs = learner_lib.grpo_step, learner_lib.LogprobFn

    def update(graphdef, tx, optim, loss, **kw):
        key = ("update", graphdef, optim, loss, *sorted(kw.items()))
        if key not in made:
            made[key] = real_update(graphdef, tx, optim, loss, **kw)
        return made[key]

    def logprobs(graphdef, **kw):
        key = ("logprobs", graphdef, *sorted(kw.items()))
        if key not in made:
            made[key] = real_logprobs(graphdef, **kw)
        return made[key]

    monkeypatch.setattr(learner_lib, "grpo_step", update)
    monkeypatch.setattr(learner_lib, "LogprobFn", logprobs)
    return made
