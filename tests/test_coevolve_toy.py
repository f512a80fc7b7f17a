"""Co-evolution end to end on a toy whose truth is known: of three chunks, one really helps, one
really hurts and one does nothing. The policy is scripted (it succeeds with a probability set by
which chunks its prompt holds), everything else is the real trainer: masks, GRPO steps on a tiny
model, retries, the offline analysts, the paired validation gate and its regression, the bank's
rounds. Two rounds must keep the helpful chunk and retire the harmful one.
"""

import json
import zlib

import numpy as np
import pytest

from sim.policies import OraclePolicy
from sim.world import build_world

from intraskill_jax import coevolve, policy, runconfig
from intraskill_jax.agent import episode
from intraskill_jax.rollout.base import ScriptedEngine
from intraskill_jax.skills.bank import Chunk, SkillBank
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action

from tests.runs import QUICKSTART

CHUNKS = {  # id -> (text, effect on the chance of success)
    "helpful": ("Read the whole request before you act.", +0.4),
    "harmful": ("Buy whatever comes first.", -0.4),
    "idle": ("The shop opens every day.", 0.0),
}
BASE_SUCCESS = 0.5


class ChunkSensitiveEngine(ScriptedEngine):
    """Plays the oracle with probability BASE_SUCCESS + the effects of the chunks in its prompt,
    else clicks 'buy now' until the episode is cut (a failure). One uniform draw per episode
    decides: in a gate it is keyed by (round, task), so a task's bare, random-mask and full-skill
    episodes share it (common random numbers: the paired deltas carry the chunks' effects, not
    coin noise); in training by the session, so siblings differ."""

    def __init__(self, tokenizer):
        self.tokenizer, self.envs, self.plans = tokenizer, {}, {}
        super().__init__(lambda s: tokenizer.encode(s, add_special_tokens=False), self._script,
                         tokenizer.convert_tokens_to_ids(IM_END))

    def _script(self, session, ids):
        env = self.envs[session]
        if session not in self.plans:
            prompt = self.tokenizer.decode(ids)
            p = BASE_SUCCESS + sum(effect for text, effect in CHUNKS.values() if text in prompt)
            prefix = session.rsplit("-", 1)[0]
            key = f"{prefix}/{env.task.task_id}" if prefix.startswith("gate") else session
            coin = np.random.default_rng(zlib.crc32(key.encode())).random()
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


def toy_config(bank_dir):
    cd = runconfig.load_file(QUICKSTART).to_dict()
    cd["policy"]["init"].update(hidden_size=64, intermediate_size=128, head_dim=16, num_hidden_layers=2,
                                layer_types=("linear_attention", "full_attention"),
                                linear_key_head_dim=16, linear_value_head_dim=16)
    cd["policy"]["tokenizer_vocab_size"] = 512
    cd["sim"]["env"]["reward"] = "strict"
    cd["sim"]["splits"].update(num_test=20, num_validation=120)
    cd["eval"]["num_tasks"] = 20  # what the test split holds (the toy trains only)
    cd["warm_start"]["enabled"] = False
    cd["train"].update(rounds=2, gate_every=1, groups_per_step=2, group_size=4, checkpoint_every=1)
    cd["skills"].update(initial=str(bank_dir), validation_tasks=120)
    cd["skills"]["analysts"]["max_proposals"] = 1
    cd["skills"]["gate"]["bootstrap_resamples"] = 100
    return runconfig.load(cd)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_rounds_keep_the_helpful_chunk_and_retire_the_harmful_one(toy_bank, tmp_path, monkeypatch):
    holder = {}

    def with_envs(real):
        def run(engine, envs, tokenizer, specs, *args, episode_prefix, **kw):
            for i, env in enumerate(envs):
                holder["engine"].envs[f"{episode_prefix}-{i}"] = env
            return real(engine, envs, tokenizer, specs, *args, episode_prefix=episode_prefix, **kw)
        return run

    monkeypatch.setattr(episode, "run_episodes", with_envs(episode.run_episodes))  # under run_groups
    config = toy_config(toy_bank)
    workdir = tmp_path / "run"
    base = policy.prepare_policy(config, workdir, build_world(config.sim))
    tokenizer = policy.load_tokenizer(base, config.for_policy(base).agent)
    holder["engine"] = ChunkSensitiveEngine(tokenizer)
    run = coevolve.Coevolution.start(config, workdir, progress=False, engine=holder["engine"])
    try:
        final = run.run()
    finally:
        run.close()

    for r in range(2):
        gate = json.loads((workdir / "gates" / f"round_{r}.json").read_text())
        beta = dict(zip(gate["columns"], gate["beta"]))
        decisions = {d["column"]: d["action"] for d in gate["decisions"]}
        assert decisions["helpful"] == "retain" and beta["helpful"] > 0.15, (r, beta)
        if r == 0:
            assert decisions["harmful"] == "retire" and beta["harmful"] < -0.15, beta
        else:
            assert "harmful" not in gate["columns"]  # retired chunks stay out of later rounds
    assert "helpful" in final.active_ids and "harmful" not in final.active_ids
    assert final.chunk("harmful").status == "retired"
