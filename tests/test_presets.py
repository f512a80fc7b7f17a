"""Each ablation preset (intraskill_jax/presets.py) for one real co-evolution step, scripted policy:
the contexts its groups saw, whether all-wrong groups were retried, whether the gate ran and the
bank moved on.

The policy answers every turn with `click[buy now]` before any search, so every episode fails:
no group has reward variance, the step makes no GRPO update (nothing to compile), and every
group is retried wherever the preset retries. Everything else is the real loop at the smoke size:
the config files' presets, mask sampling, retry, the gate, the bank's rounds.
"""

import pytest

from sim.world import build_world

from intraskill_jax import coevolve, policy, presets, rundir, runconfig
from intraskill_jax.rollout.base import ScriptedEngine
from intraskill_jax.rundir import latest_round
from intraskill_jax.skills.bank import SkillBank
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action

from tests.runs import SMOKE

# One step that closes one round, no warm start: the preset's whole cycle at the smallest size.
ONE_STEP = {"warm_start.enabled": False, "train.rounds": 1, "train.gate_every": 1}


class BuyNowEngine(ScriptedEngine):
    def __init__(self, tokenizer):
        reply = format_tool_calls([from_env_action("click[buy now]")], "xml")
        super().__init__(lambda s: tokenizer.encode(s, add_special_tokens=False), lambda session, ids: reply,
                         tokenizer.convert_tokens_to_ids(IM_END))


def preset_config(preset, **overrides):
    return runconfig.with_overrides(runconfig.load(presets.apply(runconfig.read_file(SMOKE), preset)),
                                    {**ONE_STEP, **overrides})


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """The world and the fresh policy every preset starts from (presets change neither)."""
    config = preset_config("coevolve")
    world = build_world(config.sim)
    base = policy.prepare_policy(config, tmp_path_factory.mktemp("policy"), world)
    return world, base, policy.load_tokenizer(base, config.for_policy(base).agent)


def one_step(preset, shared, workdir):
    world, base, tokenizer = shared
    config = preset_config(preset, **{"policy.path": str(base)})
    run = coevolve.Coevolution.start(config, workdir, progress=False, world=world, engine=BuyNowEngine(tokenizer))
    try:
        assert run.learner.config is config.train  # the learner reads the run's `train` section itself
        final = run.run()
    finally:
        run.close()
    rows = rundir.read_jsonl(rundir.rollouts_path(workdir, 0))
    initial = SkillBank.load(runconfig.resolve_repo_path(config.skills.initial))
    assert rows and not any(r["success"] for r in rows)
    return config, rows, initial, final


def test_plain_grpo_never_shows_a_skill_never_retries_and_never_gates(shared, tmp_path):
    config, rows, initial, final = one_step("plain_grpo", shared, tmp_path)
    assert config.skills.mode == "none"
    assert len(rows) == config.train.groups_per_step * config.train.group_size  # no retry episodes
    assert all(r["skill_mask"] == [] and not r["retry"] for r in rows)
    assert not rundir.gate_path(tmp_path, 0).exists() and latest_round(tmp_path) == 0
    assert final.active_ids == initial.active_ids


def test_fixed_skill_shows_the_whole_initial_bank_and_never_changes_it(shared, tmp_path):
    config, rows, initial, final = one_step("fixed_skill", shared, tmp_path)
    full = [1] * len(initial.active)
    assert config.skills.mode == "fixed" and len(full) > 1
    first = [r for r in rows if not r["retry"]]
    assert len(first) == config.train.groups_per_step * config.train.group_size
    assert all(r["skill_mask"] == full for r in rows)
    assert any(r["retry"] for r in rows)  # every group failed, so every group was retried (full skill)
    assert not rundir.gate_path(tmp_path, 0).exists() and latest_round(tmp_path) == 0
    assert final.round == 0 and final.active_ids == initial.active_ids


def test_no_mask_shows_the_whole_bank_and_evolves_it(shared, tmp_path):
    config, rows, initial, final = one_step("no_mask", shared, tmp_path)
    full = [1] * len(initial.active)
    assert config.skills.mode == "coevolve"
    assert all(r["skill_mask"] == full for r in rows) and any(r["retry"] for r in rows)
    # Evolution on: the gate closed round 0 and committed round 1 (its decisions rest on evidence;
    # with every episode failed it has none, so the chunks may stay as they were).
    assert rundir.gate_path(tmp_path, 0).is_file() and latest_round(tmp_path) == 1 and final.round == 1
