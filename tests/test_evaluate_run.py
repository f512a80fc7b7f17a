"""`evaluate()` plays what each condition names: the base rows are sampled by the starting policy and
the trained rows by `hf/final` (checked by teacher-forcing each row's sampled tokens under both sets
of weights: the rollout log-probs match the named policy and not the other), `*_skill` prompts hold
exactly the named bank's active chunks and `*_bare` prompts none, and every condition plays the
same tasks with the same seed (so a condition played twice replays itself)."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from sim.world import build_world

from intraskill_jax import evaluate as evaluate_lib
from intraskill_jax.evaluate import evaluation_stage
from intraskill_jax import rundir
from intraskill_jax.main import job_plan
from intraskill_jax.policy import load_policy, load_tokenizer, prepare_policy
from intraskill_jax.models.params import save_pretrained
from intraskill_jax.progress import Progress
from intraskill_jax.rl.sft import reply_logprobs
from intraskill_jax.runconfig import resolve_repo_path, with_overrides
from intraskill_jax.skills.bank import LedgerEntry, SkillBank

from tests.runs import smoke_config

NUM_TASKS = 3


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    """A workdir with a fresh base policy, a perturbed `hf/final`, S0 as round 0 and a round 1 that
    retired two chunks; then `evaluate` with every played trajectory captured."""
    workdir = tmp_path_factory.mktemp("eval")
    config = with_overrides(smoke_config(), {"warm_start.enabled": False, "eval.num_tasks": NUM_TASKS,
                                             "eval.sampling.max_new_tokens": 16, "agent.max_turns": 2,
                                             # log-probs of the untruncated T=1 distribution: what teacher forcing scores
                                             "eval.sampling.temperature": 1.0, "eval.sampling.top_p": 1.0,
                                             "eval.sampling.top_k": 0})
    world = build_world(config.sim)
    base = prepare_policy(config, workdir, world)
    trained = load_policy(config, base)
    state = nnx.state(trained, nnx.Param)
    leaves, treedef = jax.tree.flatten(state)
    keys = jax.random.split(jax.random.key(7), len(leaves))
    nnx.update(trained, jax.tree.unflatten(treedef, [x + 0.05 * jax.random.normal(k, x.shape, x.dtype)
                                                     for x, k in zip(leaves, keys)]))
    final = workdir / "hf" / "final"  # where `evaluate` reads the trained policy
    save_pretrained(trained, final)
    load_tokenizer(base, config.for_policy(base).agent).save_pretrained(final)

    s0 = SkillBank.load(resolve_repo_path(config.skills.initial))
    s0.save_round(workdir)
    retired = set(s0.active_ids[:2])
    s1 = s0.next_version([dataclasses.replace(c, status="retired") if c.id in retired else c for c in s0.chunks],
                         [LedgerEntry(c, "retire", "test") for c in sorted(retired)])
    s1.save_round(workdir)

    played = {}
    real_play = evaluate_lib.play

    def capture(*args, prefix, **kw):
        trajs = real_play(*args, prefix=prefix, **kw)
        played[prefix.removeprefix("eval-")] = trajs
        return trajs

    mp = pytest.MonkeyPatch()
    mp.setattr(evaluate_lib, "play", capture)
    try:
        conditions = [*(evaluate_lib.DEFAULT[c] for c in config.eval.conditions),
                      evaluate_lib.Condition("trained_bare_again", "trained", "none")]
        progress = Progress(job_plan(config, "eval", [c.name for c in conditions]), enabled=False)
        rows = evaluate_lib.evaluate(config, workdir, conditions, world=world, progress=progress)
    finally:
        mp.undo()
    return config, workdir, base, final, s0, s1, rows, played, progress


def _sampled_logprob(model, tokenizer, traj) -> float:
    return float(sum(reply_logprobs(model, [traj], pad_id=tokenizer.pad_token_id, batch_size=1)[0]))


def test_each_condition_is_sampled_by_the_policy_it_names(evaluated):
    config, _, base, final, _, _, _, played, _ = evaluated
    tokenizer = load_tokenizer(base, config.for_policy(base).agent)
    models = {"base": load_policy(config, base), "trained": load_policy(config, final)}
    for name, trajs in played.items():
        own, other = ("trained", "base") if name.startswith("trained") else ("base", "trained")
        for t in trajs:
            recorded = float(np.sum(t.logprobs))
            assert recorded == pytest.approx(_sampled_logprob(models[own], tokenizer, t), abs=1e-2 + 1e-3 * abs(recorded))
        gaps = [abs(float(np.sum(t.logprobs)) - _sampled_logprob(models[other], tokenizer, t)) for t in trajs]
        assert max(gaps) > 0.5, f"{name}: the {other} policy scores its samples as well as the {own} one"


def test_skill_prompts_hold_the_named_banks_active_chunks_and_bare_prompts_none(evaluated):
    config, _, base, _, s0, s1, rows, played, _ = evaluated
    tokenizer = load_tokenizer(base, config.for_policy(base).agent)
    lang = config.sim.catalog.lang
    every_chunk = {c.id: c.text(lang).strip() for c in s0.chunks}
    expect = {"base_skill": s0, "trained_skill": s1}
    for name, trajs in played.items():
        bank = expect.get(name)
        on = set() if bank is None else set(bank.active_ids)
        for t in trajs:
            prompt = tokenizer.decode(t.token_ids[: t.prompt_length])
            shown = {cid for cid, text in every_chunk.items() if text in prompt}
            assert shown == on, f"{name}: prompt shows {sorted(shown)}, the bank's active chunks are {sorted(on)}"
    by_condition = {}
    for r in rows:
        by_condition.setdefault(r["condition"], []).append(r)
    assert {r["skill"] for r in by_condition["trained_skill"]} == {s1.name}
    assert all(r["chunks"] == list(s1.active_ids) for r in by_condition["trained_skill"])
    assert all(r["chunks"] == [] for r in by_condition["base_bare"] + by_condition["trained_bare"])


def test_conditions_pair_on_tasks_and_replay_with_the_same_seed(evaluated):
    _, workdir, _, _, _, _, rows, played, _ = evaluated
    tasks = {name: [t.task_id for t in trajs] for name, trajs in played.items()}
    assert all(ts == tasks["base_bare"] for ts in tasks.values()) and len(tasks["base_bare"]) == NUM_TASKS
    again, first = played["trained_bare_again"], played["trained_bare"]
    assert [t.token_ids for t in again] == [t.token_ids for t in first]
    assert len(rows) == 5 * NUM_TASKS and rundir.read_jsonl(rundir.eval_outcomes_path(workdir)) == rows


def test_each_condition_is_a_planned_stage_of_the_progress_display(evaluated):
    """The display's plan (`main.job_plan`) names the stages `evaluate` enters, one per condition,
    each told every episode it played: no stage is unplanned (whose cost the ETA would not know)."""
    config, _, _, _, _, _, rows, played, progress = evaluated
    stages = progress._stages
    assert list(stages) == [evaluation_stage(name) for name in played]
    for name, trajs in played.items():
        stage = stages[evaluation_stage(name)]
        assert stage.ran == stage.total == len(trajs) == NUM_TASKS and stage.kinds == ("evaluation", "episodes")
    assert progress.remaining() == 0.0
