"""Co-evolution end to end on a toy whose truth is known: of three chunks, one helps (+0.15), one
hurts (-0.15) and one does nothing. The policy is scripted (it succeeds with a probability set by
its task and the chunks its prompt holds), everything else is the real trainer: masks, GRPO steps
on a tiny model, retries, the offline analysts, the paired validation gate and its regression, the
bank's rounds.

Every episode draws its own coin, so a task's bare, random-mask and full-skill episodes are
independent, as reruns of a sampled policy are; what pairs them is the task: half the tasks are
easy (0.85 before the chunks) and half hard (0.15), so a pairing of arms across tasks adds the
difficulty gap to each delta. The validation tasks are as many as `skills.power` says the gate
needs to keep a +0.15 chunk and drop a -0.15 one 99 times in 100 with the 'positive' rule.

Asserted of both gates: the helpful chunk kept, the harmful one retired (then gone), each column's
99% interval covering its true effect (the null chunk's and the analysts' proposals' covering
zero), every episode's success the engine's own verdict (so the truth is exact), and each standard
error between 0.85 and 1.25 times what the paired design predicts for the gate's own masks and
tasks (1.00 to 1.15 measured). Sabotage checked on copies of the package, where the decisions and
the intervals' coverage alone catch neither: the random arm played on the next task instead of
the same one (`gate.run_gate`'s arm_tasks) keeps every decision right and every interval over its
truth, and fails the standard-error band (1.37 to 1.46 times the prediction); the standard errors
halved (`stats.chunk_contributions`, intervals with them) still cover the truth here, and fail the
band (0.50 to 0.54).
"""

import json
import math
import zlib

import numpy as np
import pytest
from scipy import stats as sps

from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax import coevolve, policy, runconfig
from intraskill_jax.agent import episode
from intraskill_jax.rollout.base import ScriptedEngine
from intraskill_jax.skills import power
from intraskill_jax.skills.bank import Chunk, SkillBank
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action

from tests.runs import QUICKSTART

EFFECT = 0.15
CHUNKS = {  # id -> (text, effect on the chance of success)
    "helpful": ("Read the whole request before you act.", +EFFECT),
    "harmful": ("Buy whatever comes first.", -EFFECT),
    "idle": ("The shop opens every day.", 0.0),
}
EASY, HARD = 0.85, 0.15  # a task's chance before the chunks; with them it stays within [0, 1]
COLUMNS = 4  # the three chunks and the analysts' one proposal a round
ALPHA = 0.01  # the gate's intervals are 99%: eight of them must all cover their truth


def difficulty(task_id: int) -> float:
    return EASY if zlib.crc32(f"task/{task_id}".encode()) % 2 else HARD


def validation_tasks() -> int:
    """The fewest validation tasks (a multiple of 20) with which the gate's 'positive' rule keeps a
    +EFFECT chunk and retires a -EFFECT one with probability 0.99 each (`skills.power`). Its
    difficulties are uniform over [HARD, EASY], which has more outcome variance than the toy's
    two-point mix, so the toy's gate has at least that power."""
    _, se_one_task, _ = power.predicted_se(power.PowerConfig(
        betas=(EFFECT, -EFFECT, 0.0, 0.0), n_tasks=1, base_low=HARD, base_high=EASY, coupling=0.0), draws=100_000)
    n = 20 * math.ceil((sps.norm.ppf(0.99) * se_one_task / EFFECT) ** 2 / 20)  # SE shrinks as 1/sqrt(n)
    _, se, _ = power.predicted_se(power.PowerConfig(
        betas=(EFFECT, -EFFECT, 0.0, 0.0), n_tasks=n, base_low=HARD, base_high=EASY, coupling=0.0), draws=100_000)
    assert sps.norm.cdf(EFFECT / se) >= 0.99
    return n


def expected_se(bare: list[dict], random: list[dict], betas: list[float]) -> np.ndarray:
    """The standard errors the gate's fit should report for its own masks X: the sandwich
    (X'X)^-1 X' diag(s) X (X'X)^-1 with s_i the variance of row i's paired delta R_i - B_i under the
    toy's truth, p(1 - p) of the random-arm episode (p its task's difficulty plus its chunks'
    effects) plus q(1 - q) of the bare one. `skills.power`'s c_K sigma^2 / n is its large-n form."""
    masks = np.array([e["mask"] for e in random], np.float64)
    p = np.array([difficulty(e["task_id"]) for e in random]) + masks @ np.asarray(betas)
    q = np.array([difficulty(e["task_id"]) for e in bare])
    inv = np.linalg.inv(masks.T @ masks)
    cov = inv @ (masks.T * (p * (1 - p) + q * (1 - q))) @ masks @ inv
    return np.sqrt(np.diag(cov))


class ChunkSensitiveEngine(ScriptedEngine):
    """Plays the oracle with probability difficulty(task) + the effects of the chunks in its
    prompt, else clicks 'buy now' until the episode is cut (a failure). One uniform draw per
    episode decides, keyed by its session (unique per episode of a run), so no two episodes share
    a draw: not the siblings of a group, not a task's three gate arms."""

    def __init__(self, tokenizer):
        self.tokenizer, self.envs, self.plans = tokenizer, {}, {}
        super().__init__(lambda s: tokenizer.encode(s, add_special_tokens=False), self._script,
                         tokenizer.convert_tokens_to_ids(IM_END))

    def _script(self, session, ids):
        env = self.envs[session]
        if session not in self.plans:
            prompt = self.tokenizer.decode(ids)
            p = difficulty(env.task.task_id) + sum(effect for text, effect in CHUNKS.values() if text in prompt)
            coin = np.random.default_rng(zlib.crc32(session.encode())).random()
            policy = OraclePolicy()
            policy.reset(env, "")
            self.plans[session] = policy if coin < p else None
        policy = self.plans[session]
        action = policy.act(env, "") if policy is not None else "click[buy now]"
        return format_tool_calls([from_env_action(action)], "xml")


@pytest.fixture
def toy_bank(tmp_path):
    root = tmp_path / "toy"
    chunks = [Chunk(cid, text, text, title=cid) for cid, (text, _) in CHUNKS.items()]
    SkillBank(name="toy", description="Three chunks with known effects.", chunks=tuple(chunks)).save(root)
    return root


def toy_config(bank_dir, n):
    cd = runconfig.load_file(QUICKSTART).to_dict()
    cd["policy"]["init"].update(hidden_size=64, intermediate_size=128, head_dim=16, num_hidden_layers=2,
                                layer_types=("linear_attention", "full_attention"),
                                linear_key_head_dim=16, linear_value_head_dim=16)
    cd["policy"]["tokenizer_vocab_size"] = 512
    cd["sim"]["env"]["reward"] = "strict"
    # Room for the oracle's longest episodes (17 steps on these tasks) and calls: it always
    # succeeds, so each chunk's true effect on success is exactly the one above.
    cd["sim"]["env"]["max_steps"] = 18
    cd["agent"]["max_turns"] = 18
    cd["agent"]["max_context_tokens"] = 4096
    cd["rollout"]["sampling"]["max_new_tokens"] = 128
    cd["sim"]["splits"].update(num_test=20, num_validation=n)
    cd["eval"]["num_tasks"] = 20  # what the test split holds (the toy trains only)
    cd["warm_start"]["enabled"] = False
    cd["train"].update(rounds=2, gate_every=1, groups_per_step=2, group_size=4, checkpoint_every=1)
    cd["skills"].update(initial=str(bank_dir), validation_tasks=n)
    cd["skills"]["analysts"]["max_proposals"] = 1
    cd["skills"]["gate"].update(bootstrap_resamples=100, alpha=ALPHA, rule="positive")
    return runconfig.load(cd)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_rounds_keep_the_helpful_chunk_retire_the_harmful_one_and_cover_the_truth(toy_bank, tmp_path,
                                                                                     monkeypatch):
    holder = {}

    def with_envs(real):
        def run(engine, envs, tokenizer, specs, *args, episode_prefix, **kw):
            for i, env in enumerate(envs):
                holder["engine"].envs[f"{episode_prefix}-{i}"] = env
            return real(engine, envs, tokenizer, specs, *args, episode_prefix=episode_prefix, **kw)
        return run

    monkeypatch.setattr(episode, "run_episodes", with_envs(episode.run_episodes))  # under run_groups
    n = validation_tasks()
    config = toy_config(toy_bank, n)
    workdir = tmp_path / "run"
    base = policy.prepare_policy(config, workdir, build_world(config.sim))
    tokenizer = policy.load_tokenizer(base, config.for_policy(base).agent)
    holder["engine"] = ChunkSensitiveEngine(tokenizer)
    run = coevolve.Coevolution.start(config, workdir, progress=False, engine=holder["engine"])
    try:
        final = run.run()
    finally:
        run.close()

    truth = {cid: effect for cid, (_, effect) in CHUNKS.items()}
    for r in range(2):
        gate = json.loads((workdir / "gates" / f"round_{r}.json").read_text())
        assert gate["n"] == n and len(gate["columns"]) <= COLUMNS
        decisions = {d["column"]: d["action"] for d in gate["decisions"]}
        assert decisions["helpful"] == "retain", (r, gate["beta"])
        if r == 0:
            assert decisions["harmful"] == "retire", gate["beta"]
        else:
            assert "harmful" not in gate["columns"]  # retired chunks stay out of later rounds
        # The truth is the engine's: every episode it gave the oracle succeeded, and no other did.
        episodes = [json.loads(line) for line in (workdir / "gates" / f"round_{r}_episodes.jsonl").open()]
        assert len(episodes) == 3 * n
        assert all(e["success"] == (holder["engine"].plans[e["episode_id"]] is not None) for e in episodes)
        # Proposals' texts are none of the chunks', which the engine alone reacts to: their truth is 0.
        betas = [truth.get(col, 0.0) for col in gate["columns"]]
        arms = {arm: [e for e in episodes if e["arm"] == arm] for arm in ("bare", "random")}
        expected = expected_se(arms["bare"], arms["random"], betas)
        for col, beta, low, high, se, want in zip(gate["columns"], betas, gate["ci_low"], gate["ci_high"], gate["se"],
                                                  expected):
            assert low <= beta <= high, (r, col, beta, low, high)
            assert 0.85 * want <= se <= 1.25 * want, (r, col, se, want)  # HC3 runs a little high
    assert "helpful" in final.active_ids and "harmful" not in final.active_ids
    assert final.chunk("harmful").status == "retired"
