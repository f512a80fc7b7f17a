"""The main job end to end on a shortened quickstart: warm start, two co-evolution rounds through the
real loop (embedded JAX sampler, offline analyst, gate), the four-condition evaluation, the report,
and a bundle that verifies. Then a run from nothing killed with SIGKILL once in each stage (the
base policy, the warm start, both rounds, the final export, the evaluation, the report) resumes to
the same records (the same run on gs:// is tests/test_gcs_run.py)."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sim.world import build_world

from intraskill_jax import rundir
from intraskill_jax.agent.demos import action_kind
from intraskill_jax.agent.trajectory import bucket_length
from intraskill_jax.metrics import read_metrics
from intraskill_jax.policy import load_policy, load_tokenizer
from intraskill_jax.rundir import latest_round
from intraskill_jax.skills.analysts import validate
from intraskill_jax.skills.bank import SkillBank
from intraskill_jax.warm_start import heldout_runs

from tests import runs
from tests.runs import REPO


@pytest.fixture(scope="module")
def finished_run(smoke_reference):
    config, workdir = smoke_reference
    runs.finish(config, workdir)
    return config, workdir


def _oracle_reply_chances(model, runs, catalog, result_labels):
    """Per action kind, the mean over the runs' turns of exp(sum of the reply's token log-probs),
    each run scored by one forward pass of `model` over its whole conversation (teacher forcing)."""
    chances = {}
    for run in runs:
        ids = np.zeros((1, bucket_length(len(run.token_ids))), np.int32)
        ids[0, : len(run.token_ids)] = run.token_ids
        mask = (np.arange(ids.shape[1]) < len(run.token_ids))[None].astype(np.int32)
        logp = np.asarray(jax.nn.log_softmax(model(jnp.asarray(ids), jnp.asarray(mask))), np.float64)[0]
        sampled = np.asarray(run.loss_mask, bool)
        starts = [i for i in range(len(sampled)) if sampled[i] and (i == 0 or not sampled[i - 1])]
        ends = [i for i in range(1, len(sampled) + 1) if sampled[i - 1] and (i == len(sampled) or not sampled[i])]
        assert len(starts) == len(run.turns)
        for turn, i, j in zip(run.turns, starts, ends, strict=True):
            # Token t is predicted at position t - 1.
            reply = sum(logp[t - 1, run.token_ids[t]] for t in range(i, j))
            chances.setdefault(action_kind(turn.action, catalog, result_labels), []).append(np.exp(reply))
    return {kind: float(np.mean(values)) for kind, values in chances.items()}


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_two_rounds_record_masks_fit_the_gate_and_version_the_bank(finished_run):
    config, workdir = finished_run
    s0 = SkillBank.load(REPO / "skills" / "s0")
    # The warm start is scored on held-out oracle runs: per action kind, the chance that the
    # warmed-up policy samples the oracle's reply. Recomputed here from the published policy, and
    # the starting policy scores otherwise (the metric is the warm start's, not the base's).
    agree = {k.removeprefix("eval/sft_agree_"): v for row in read_metrics(rundir.sft_dir(workdir))
             for k, v in row.items() if k.startswith("eval/sft_agree_")}
    sft, base = rundir.sft_policy_dir(workdir), rundir.base_policy_dir(workdir)
    sft_config = config.for_policy(sft)
    world = build_world(config.sim)
    heldout = heldout_runs(sft_config, world, load_tokenizer(sft, sft_config.agent))
    assert [t.task_id for t in heldout] == [int(t) for t in world.splits.validation[: config.warm_start.heldout_demos]]
    labels = config.sim.env.result_labels
    want = _oracle_reply_chances(load_policy(sft_config, sft), heldout, world.catalog, labels)
    assert agree.keys() == want.keys() and {"search", "product"} <= agree.keys()
    for kind, chance in want.items():
        assert np.log(agree[kind]) == pytest.approx(np.log(chance), abs=1e-3), kind
    before = _oracle_reply_chances(load_policy(sft_config, base), heldout, world.catalog, labels)
    assert max(abs(np.log(before[k]) - np.log(agree[k])) for k in agree) > 0.1
    # Masks: every training episode carries the mask of its group (siblings share it).
    steps = config.train.steps
    for step in range(steps):
        rows = rundir.read_jsonl(rundir.rollouts_path(workdir, step))
        first = [r for r in rows if not r["retry"]]
        assert len(first) == config.train.groups_per_step * config.train.group_size
        bank = SkillBank.load_round(workdir, step // config.train.gate_every)
        for r in first:
            assert len(r["skill_mask"]) == len(bank.active)
        by_group = {}
        for r in first:
            by_group.setdefault(r["group"], set()).add(tuple(r["skill_mask"]))
        assert all(len(m) == 1 for m in by_group.values())
        for r in rows:
            if r["retry"]:
                assert r["skill_mask"] == [1] * len(bank.active)
    # Bank versions: round 0 is S0, then one per gate, each with its ledger.
    assert latest_round(workdir) == config.train.rounds
    assert [c.id for c in SkillBank.load_round(workdir, 0).active] == [c.id for c in s0.active]
    for r in range(config.train.rounds):
        gate = json.loads(rundir.gate_path(workdir, r).read_text())
        bank = SkillBank.load_round(workdir, r)
        nxt = SkillBank.load_round(workdir, r + 1)
        k = len(gate["columns"])
        assert gate["columns"][: len(bank.active)] == list(bank.active_ids)
        assert len(gate["beta"]) == len(gate["se"]) == k and gate["n"] == config.skills.validation_tasks
        # The fit equals an independent least-squares solve on the recorded random arm.
        eps = rundir.read_jsonl(rundir.gate_episodes_path(workdir, r))
        bare = np.array([e["reward"] for e in eps if e["arm"] == "bare"])
        rand = [e for e in eps if e["arm"] == "random"]
        x = np.array([e["mask"] for e in rand], float)
        y = np.array([e["reward"] for e in rand]) - bare
        beta = np.linalg.lstsq(x, y, rcond=None)[0]
        np.testing.assert_allclose(gate["beta"], beta, atol=1e-8)
        # Proposals passed the validators against the bank they were made for; rejects say why.
        from intraskill_jax.skills.bank import Proposal

        for p in gate["proposals"]:
            prop = Proposal(**{**p, "trajectory_ids": tuple(p["trajectory_ids"])})
            assert validate(prop, bank, config.skills.analysts) == []
        assert all(rej["reasons"] for rej in gate["rejected"])
        # Every decision is in the next round's ledger; retired chunks never render.
        assert {e.chunk_id for e in nxt.ledger} >= {d["column"] for d in gate["decisions"]
                                                    if d["action"] in ("retain", "retire") and d["kind"] == "chunk"}
        assert gate["funnel"]["proposals"] == len(gate["proposals"])
        assert set(nxt.active_ids) <= {c.id for c in nxt.chunks}
    # The loops above ran on something: the analysts proposed in at least one round.
    assert sum(len(json.loads(rundir.gate_path(workdir, r).read_text())["proposals"]) for r in range(config.train.rounds))
    rows = read_metrics(workdir)
    assert [r["step"] for r in rows if "rollout/success" in r] == list(range(1, steps + 1))
    assert sorted(r["step"] for r in rows if "gate/bare_reward" in r) == [2, 4]


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_evaluation_report_and_bundle(finished_run):
    from intraskill_jax.analysis.bundle import check_bundle

    config, workdir = finished_run
    rows = rundir.read_jsonl(rundir.eval_outcomes_path(workdir))
    conds = {}
    for r in rows:
        conds.setdefault(r["condition"], []).append(r["task_id"])
    assert sorted(conds) == sorted(config.eval.conditions)
    assert all(tasks == conds["base_bare"] for tasks in conds.values())  # paired on the same tasks
    skills = {r["condition"]: r["skill"] for r in rows}
    assert skills["base_bare"] == skills["trained_bare"] == "none"
    initial = SkillBank.load(REPO / config.skills.initial)
    assert skills["base_skill"] == initial.name and skills["trained_skill"] == f"s{config.train.rounds}"
    check = check_bundle(workdir / "bundle")  # raises, naming the file, on any mismatch
    assert check.files > 5 and check.values > 0
    assert (workdir / "report" / "index.html").is_file()


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(2400)
def test_runs_killed_at_each_phase_resume_to_the_uninterrupted_run(finished_run, tmp_path):
    """SIGKILL `intraskill train`, `eval` and `report` at each named phase in turn (`tests.runs.KILLS`:
    the base policy and the warm start written but not committed, a step's episodes not trained on,
    a checkpoint mid-commit, a gate recorded before its bank, a bank before the next metrics, round
    1's second step, hf/final and the bundle before their commit, the outcomes before the traces),
    resume each time, and compare the finished run with the uninterrupted one: the same hf/final and
    warm start, bank decisions, episodes, metrics, evaluation records and bundle files."""
    config, reference = finished_run
    workdir = tmp_path / "killed"
    runs.run_through_kills(str(workdir), env={})
    runs.assert_same_run(reference, workdir, config)
