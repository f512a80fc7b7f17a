"""The GRPO loop end to end on a tiny model: update, weight push, metrics, checkpoint, resume.

Kept cheap: every update batch has one shape (a tokenizer that has learned the prompt keeps it
near 510 tokens, talking siblings run all 20 turns, about 1140 tokens, and the oracle finishes in
4-7 short turns, so each step's group collates to [2, 2048]), the model has one layer of each
kind, and the resumed Learner reuses the programs the first one compiled.
"""

import json
import shutil

import jax
import numpy as np
import pytest
from flax import nnx

from sim.config import CatalogConfig, SimConfig, SplitConfig
from sim.env import ShopEnv
from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax.agent.episode import AgentConfig, SkillContext
from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.models import ModelConfig, causal_lm_class, load_pretrained
from intraskill_jax.models import lora as lora_lib
from intraskill_jax.models.lora import LoRAConfig
from intraskill_jax.rl.grpo import LossConfig
from intraskill_jax.rl import learner as learner_lib
from intraskill_jax.rl.learner import Learner, TaskCursor, TrainConfig
from intraskill_jax.rl.train_step import OptimConfig
from intraskill_jax.rollout.base import SamplingParams, ScriptedEngine
from intraskill_jax.tokenization import (
    IM_END,
    ToolCall,
    continuation_text,
    format_tool_calls,
    from_env_action,
    tools_for,
    train_tokenizer,
)

SKILL = "Compare prices."


class MixedEngine(ScriptedEngine):
    """Odd siblings play the oracle, even ones talk: every group has reward variance."""

    def __init__(self, world, tok):
        self.world, self.pushed, self.policies = world, [], {}
        super().__init__(lambda s: tok.encode(s, add_special_tokens=False), self._script, tok.convert_tokens_to_ids(IM_END))

    def _script(self, session, ids):
        i = int(session.rsplit("-", 1)[1])
        if i % 2 == 0:
            return "hmm"
        policy, env = self.policies[session]
        return format_tool_calls([from_env_action(policy.act(env, ""))], "xml")

    def update_weights(self, weights):
        super().update_weights(weights)
        self.pushed.append(weights.version)


@pytest.fixture(scope="module")
def world_tok():
    world = build_world(SimConfig(catalog=CatalogConfig(num_products=1200), splits=SplitConfig(num_test=20, num_validation=20)))
    env = ShopEnv(world)
    # Besides titles, the tokenizer learns the prompt, tool calls and tool responses: short rows.
    chat = [system_prompt(env.lang, env.config.mode, SKILL), json.dumps(tools_for(env.config.mode)),
            continuation_text(tool_responses=["Error: no tool call"])]
    tasks = world.catalog.tasks
    calls = [format_tool_calls([ToolCall("search", {"keywords": tasks[i].instruction})], "xml")
             for i in range(0, len(tasks), max(1, len(tasks) // 100))]
    tok = train_tokenizer([world.catalog[i].title for i in range(0, 1200, 2)] + chat * 20 + calls, vocab_size=1500)
    return world, tok


@pytest.fixture
def shared_programs(monkeypatch):
    """Learners of one configuration share one update and one log-prob program.

    jit keeps compiled code on those objects, and they depend only on the graph and the configs,
    so a resumed Learner reuses what the uninterrupted one compiled (as one process would).
    """
    made = {}
    real_update, real_logprobs = learner_lib.grpo_step, learner_lib.LogprobFn

    def once(key, build):
        if key not in made:
            made[key] = build()
        return made[key]

    def update(graphdef, tx, optim, loss, **kw):  # tx is rebuilt from `optim` by each Learner
        return once(("update", graphdef, optim, loss, *sorted(kw.items())),
                    lambda: real_update(graphdef, tx, optim, loss, **kw))

    def logprobs(graphdef, **kw):
        return once(("logprobs", graphdef, *sorted(kw.items())), lambda: real_logprobs(graphdef, **kw))

    monkeypatch.setattr(learner_lib, "grpo_step", update)
    monkeypatch.setattr(learner_lib, "LogprobFn", logprobs)
    return made


def make(world, tok, workdir, engine, steps=3, **train):
    # One DeltaNet and one attention layer: both mixers, half the compile and run time of four.
    cfg = ModelConfig.tiny_qwen3_5(vocab_size=len(tok), num_hidden_layers=2,
                                   layer_types=("linear_attention", "full_attention"))
    model = causal_lm_class(cfg)(cfg, rngs=nnx.Rngs(0))
    seen = []

    def contexts(step, tasks):
        seen.append((step, list(tasks)))
        return [SkillContext(SKILL, (1,)) for _ in tasks]

    learner = Learner(
        model, tok, engine, workdir, tasks=world.splits.train, make_env=lambda: ShopEnv(world),
        config=TrainConfig(**{"rounds": 1, "gate_every": steps, "groups_per_step": 1, "group_size": 2,
                              "checkpoint_every": 2, "optim": OptimConfig(learning_rate=1e-3), "loss": LossConfig(),
                              **train}),
        sampling=SamplingParams(temperature=1.0, max_new_tokens=96),
        agent=AgentConfig(tool_format="xml", max_turns=20, max_context_tokens=2048, max_observation_chars=100,
                          show_affordances=False),
        contexts_fn=contexts)
    return learner, seen


def patch_envs(engine, monkeypatch):
    """Give the scripted oracle access to each episode's env (created inside `collect`)."""
    import intraskill_jax.agent.episode as episode

    real = episode.run_episodes

    def spy(eng, envs, tok, specs, sampling, agent, *, episode_prefix, **kw):
        for i, env in enumerate(envs):
            engine.policies[f"{episode_prefix}-{i}"] = (_Lazy(env), env)
        return real(eng, envs, tok, specs, sampling, agent, episode_prefix=episode_prefix, **kw)

    monkeypatch.setattr(episode, "run_episodes", spy)  # what run_groups calls


class _Lazy(OraclePolicy):
    def __init__(self, env):
        self._env, self._ready = env, False

    def act(self, env, observation):
        if not self._ready:
            self.reset(env, observation)
            self._ready = True
        return super().act(env, observation)


def read_rows(workdir):
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_steps_update_push_log_checkpoint_and_resume_identically(world_tok, tmp_path, monkeypatch, shared_programs):
    """Two optimizer updates per batch (the old log-probs taken once at the rollout weights), so the
    resumed run must also restore the optimizer state those updates built."""
    world, tok = world_tok
    engine = MixedEngine(world, tok)
    patch_envs(engine, monkeypatch)
    full, seen = make(world, tok, tmp_path / "full", engine, updates_per_batch=2)
    for _ in range(2):
        full.train_step()
    assert full.step == 2 and full.checkpoints.all_steps() == [2]
    updates = sum(r["train/updated"] for r in read_rows(tmp_path / "full"))
    assert int(full.state.step) == 2 * updates  # the optimizer's count: two updates per batch
    while full.step < full.config.steps:  # the rest, without interruption (state stays in memory)
        full.train_step()
    full.close()
    rows = read_rows(tmp_path / "full")
    assert [r["step"] for r in rows] == [1, 2, 3]
    # A step updates exactly when some group had reward variance.
    assert all(r["train/updated"] == float(r["rollout/zero_variance_drop_rate"] < 1.0) for r in rows)
    updated = [r for r in rows if r["train/updated"]]
    assert updated and all(np.isfinite(r["train/pg_loss"]) and r["train/grad_norm"] > 0 for r in updated)
    assert engine.pushed == [1, 2, 3] and full.checkpoints.all_steps() == [2, 3]
    assert [s for s, _ in seen] == [0, 1, 2]

    # Killed after step 3 logged but before its checkpoint landed: the same directory without it.
    shutil.copytree(tmp_path / "full", tmp_path / "killed")
    shutil.rmtree(tmp_path / "killed" / "checkpoints" / "3")
    resumed_engine = MixedEngine(world, tok)
    patch_envs(resumed_engine, monkeypatch)
    resumed, seen2 = make(world, tok, tmp_path / "killed", resumed_engine, updates_per_batch=2)
    assert resumed.step == 2 and resumed.cursor.position == 2 and resumed_engine.pushed == [2]
    while resumed.step < resumed.config.steps:
        resumed.train_step()
    resumed.close()
    assert len(shared_programs) == 2  # the resumed Learner built no programs of its own
    rows_resumed = read_rows(tmp_path / "killed")
    assert [r["step"] for r in rows_resumed] == [1, 2, 3]  # the orphaned step-3 row was dropped, then redone
    assert seen2 == [(2, seen[2][1])]  # the same tasks as the uninterrupted run's third step
    assert resumed_engine.pushed == [2, 3] and resumed.checkpoints.all_steps() == [2, 3]
    assert rows_resumed[-1].keys() == rows[-1].keys()
    for key in rows[-1]:
        if key.startswith(("train/", "rollout/")):
            assert rows_resumed[-1][key] == pytest.approx(rows[-1][key], rel=1e-5, abs=1e-7), key


def test_task_cursor_epochs_are_seeded_permutations():
    c = TaskCursor(range(10), seed=3)
    first, second = c.take(10), c.take(10)
    assert sorted(first) == sorted(second) == list(range(10)) and first != second
    again = TaskCursor(range(10), seed=3, position=10)
    assert again.take(10) == second


class RecordingEngine(MixedEngine):
    def update_weights(self, weights):
        super().update_weights(weights)
        self.last = weights


def _host(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_kl_penalty_to_the_starting_policy_with_and_without_lora(world_tok, tmp_path, monkeypatch, lora):
    world, tok = world_tok
    engine = RecordingEngine(world, tok)
    patch_envs(engine, monkeypatch)
    train = {"loss": LossConfig(kl_coef=0.05), "lora": LoRAConfig(enabled=lora, rank=4),
             "optim": OptimConfig(learning_rate=1e-2)}
    learner, _ = make(world, tok, tmp_path / "run", engine, steps=2, **train)
    assert lora_lib.has_adapters(learner.state.params) == lora
    start = _host(lora_lib.base_params(learner.state.params))  # the whole start without LoRA
    for _ in range(2):
        learner.train_step()
    learner.close()
    rows = [r for r in read_rows(tmp_path / "run") if r["train/updated"]]
    assert [r["step"] for r in rows] == [1, 2]  # every group has reward variance
    # The first update scores the starting policy against itself; the second has moved off it.
    assert 0 <= rows[0]["train/kl"] < 1e-6 and rows[1]["train/kl"] > 0
    params = learner.state.params
    moved = [not np.array_equal(a, b) for a, b in zip(_host(lora_lib.base_params(params)), start)]
    assert not any(moved) if lora else any(moved)  # with LoRA the base weights are frozen
    if lora:
        # The engine got the adapters merged in, and so does the HF export.
        pushed = engine.last.model()
        assert not lora_lib.has_adapters(pushed) and lora_lib.has_adapters(learner.model())
        ids = np.asarray([tok.encode("search for a kettle", add_special_tokens=False)])
        adapted = np.asarray(learner.model()(ids))
        np.testing.assert_allclose(np.asarray(pushed(ids)), adapted, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.asarray(load_pretrained(engine.last.hf_dir())(ids)), adapted, rtol=1e-5,
                                   atol=1e-5)
    # Resumed: the trained state comes back, and the reference is still the starting policy.
    resumed, _ = make(world, tok, tmp_path / "run", RecordingEngine(world, tok), steps=2, **train)
    assert resumed.step == 2
    assert all(np.array_equal(a, b) for a, b in zip(_host(resumed.state.params), _host(params)))
    reference = _host(resumed.ref_logprobs.params(resumed.state.params))
    assert len(reference) == len(start) and all(np.array_equal(a, b) for a, b in zip(reference, start))
    resumed.close()


# -- optimizer updates per batch -----------------------------------------------------------------

# Adam's eps raised (as in test_train_step.py): a parameter whose gradient is round-off moves by
# ~0 instead of by +-lr, whose sign two equal updates could disagree on.
PASSES_OPTIM = OptimConfig(learning_rate=1e-3, eps=1e-4)


def test_one_update_per_batch_is_on_policy_without_an_old_logprob_pass(world_tok, tmp_path, monkeypatch,
                                                                       shared_programs):
    """One update with no old log-probs (the loss's own, stop-gradient) is the update the learner
    made before `updates_per_batch` existed, with the old log-probs scored by a separate pass.

    Sabotage checked: `policy_loss` taking `old_logprobs = logprobs` without the stop-gradient
    (the ratio's gradient vanishes, nothing trains) fails "the update moved the weights";
    dropping the rollout log-probs from the one-pass batch (no TIS) fails the parameter comparison."""
    world, tok = world_tok
    learners = []
    for name in ("none", "scored"):
        engine = MixedEngine(world, tok)
        patch_envs(engine, monkeypatch)
        learner, _ = make(world, tok, tmp_path / name, engine, steps=1, optim=PASSES_OPTIM)
        assert learner.old_logprobs is None  # one update: no pass at the rollout weights
        if name == "scored":
            learner.old_logprobs = learner_lib.LogprobFn(learner.graphdef, temperature=learner.sampling.temperature)
        start = _host(learner.state.params)
        learner.train_step()
        learner.close()
        learners.append(learner)
    assert read_rows(tmp_path / "none")[0]["train/updated"] == 1.0
    a, b = (_host(x.state.params) for x in learners)
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, start)) > 1e-4  # the update moved the weights
    for x, y in zip(a, b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    ra, rb = read_rows(tmp_path / "none")[0], read_rows(tmp_path / "scored")[0]
    for key in ra:
        if key.startswith("train/"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-4, abs=1e-6), key
    assert ra["train/ratio_mean"] == 1.0 and ra["train/clipfrac_low"] == ra["train/clipfrac_high"] == 0.0


def test_two_updates_per_batch_move_the_ratio_and_clip(world_tok, tmp_path, monkeypatch, shared_programs):
    """The second update's ratio is against the rollout weights, so it leaves 1 and is clipped.

    Sabotage checked: scoring the old log-probs again before each update (every ratio 1) or
    handing the second update no old log-probs fails the clip-fraction assertion."""
    world, tok = world_tok
    engine = MixedEngine(world, tok)
    patch_envs(engine, monkeypatch)
    learner, _ = make(world, tok, tmp_path / "run", engine, steps=1, updates_per_batch=2,
                      optim=OptimConfig(learning_rate=1e-2))
    learner.train_step()
    learner.close()
    row = read_rows(tmp_path / "run")[0]
    assert row["train/updated"] == 1.0 and int(learner.state.step) == 2
    assert row["train/clipfrac_low"] + row["train/clipfrac_high"] > 0, row
    assert row["train/ratio_mean"] != pytest.approx(1.0, abs=1e-4)


def test_updates_per_batch_is_validated():
    from intraskill_jax.errors import ConfigError

    with pytest.raises(ConfigError, match="train.updates_per_batch=0: must be >= 1"):
        TrainConfig(updates_per_batch=0)
