"""A real run directory in under a minute: the trainer's own code path with a scripted policy.

`build` runs `Coevolution` (mask sampling, rollouts, retries, a GRPO update of a tiny policy,
checkpoints, the gate with the offline analyst, the bank's rounds, the final export), then
`evaluate()`, on `configs/quickstart.py:smoke` without the warm start. Only the
policy's choices are scripted (`SkillfulScript`), so the records are the trainer's own, whatever
shape they drift to.

The script makes the skill matter the way it would for a learning policy: each episode is played
by the simulator's oracle (it succeeds), by a shopper who buys the first result without choosing
options (partial credit under the loose reward), or by one who pages until the turns run out
(nothing bought); the oracle's chance rises with what the prompt holds (some chunks help, one
hurts, every line the analyst wrote helps) and with updated weights. So the gate sees real
contributions: over its three rounds it retains, retires, rewrites, adds and rejects (the
analysis tests check that it still does), and the test conditions differ.

Two snapshots of the run are taken where a kill would leave them (`rundir.reached`, the crash
points of the SIGKILL tests): after its first step (no gate yet) and in the middle of round 1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import shutil
from collections.abc import Sequence
from pathlib import Path

import pytest

from sim.env import ShopEnv
from sim.policies import OraclePolicy
from sim.world import World, build_world

from intraskill_jax import coevolve, policy, rundir, runconfig
from intraskill_jax.evaluate import evaluate
from intraskill_jax.rollout.base import ScriptedEngine
from intraskill_jax.skills.bank import HEADERS, SkillBank
from intraskill_jax.tokenization import IM_END, format_tool_calls, from_env_action

from tests.runs import SMOKE

OVERRIDES = {
    "warm_start.enabled": False,
    "train.rounds": 3, "train.groups_per_step": 4, "train.group_size": 4,  # failures for the analyst
    "skills.analysts.max_proposals": 3,
    "sim.splits.num_validation": 40, "skills.validation_tasks": 40,  # tasks enough to fit the columns
    "eval.num_tasks": 20,
    # Room for the oracle's episodes and its longest calls.
    "agent.max_turns": 8, "rollout.sampling.max_new_tokens": 128, "eval.sampling.max_new_tokens": 128,
}
BASE_CHANCE = 0.2  # the oracle's share under a bare prompt and the starting weights
UPDATED = 0.1  # added once the policy has been updated (weight version > 0)
CHUNK_EFFECTS = {"query-specific": 0.25, "check-sku-price": 0.1, "confirm-options": -0.3}
EDIT_EFFECT = 0.15  # each skill line the analyst wrote (a rewritten or added chunk)
PAGERS = 0.4  # the share of tasks whose episodes that the oracle does not play buy nothing
SNAPSHOTS = {1: "fresh", 3: "partial"}  # after the step's metrics, at its checkpoint's commit
_INSTRUCTION = re.compile(r"Instruction: \[SEP\] (.*?) \[SEP\]")


def _uniform(*key: object) -> float:
    digest = hashlib.sha256(repr(key).encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _search(env: ShopEnv) -> str:
    """The script's search: type and attributes. Not the simulator oracle's, which also names the
    options: the script's records (and so every gate action the analysis tests look for) stay
    the script's own when the oracle's demonstrations change."""
    return "search[" + " ".join((env.task.product_type, *env.task.attributes)) + "]"


class _Oracle(OraclePolicy):
    """The simulator's oracle after the script's search."""

    def act(self, env: ShopEnv, observation: str) -> str:
        return _search(env) if env.page.kind == "start" else super().act(env, observation)


class _FirstResult:
    """Searches, opens the first result and buys it as it is."""

    def reset(self, env: ShopEnv, observation: str) -> None:
        pass

    def act(self, env: ShopEnv, observation: str) -> str:
        page = env.page
        if page.kind == "start":
            return _search(env)
        if page.kind == "results":
            return f"click[{env.result_button(page.results[0])}]" if page.results else "click[back to search]"
        return "click[buy now]"


class _Pager(_FirstResult):
    """Searches, then pages through the results until the episode is cut."""

    def act(self, env: ShopEnv, observation: str) -> str:
        return "click[next >]" if env.page.kind == "results" else super().act(env, observation)


class SkillfulScript(ScriptedEngine):
    """The tiny run's policy. At an episode's first turn it reads the task (the instruction) and
    the skill lines from the prompt and picks a player; the player acts on its own copy of the
    episode's environment (same world, task and actions), and each action is replied as a tool
    call."""

    def __init__(self, tokenizer, world: World, initial: SkillBank, group_size: int):
        self._tokenizer, self._world, self._group_size = tokenizer, world, group_size
        self._tasks = {t.instruction: i for i, t in enumerate(world.catalog.tasks)}
        self._initial = {c.en: CHUNK_EFFECTS.get(c.id, 0.0) for c in initial.chunks}
        self._episodes: dict[str, tuple[ShopEnv, _FirstResult | _Oracle]] = {}
        super().__init__(lambda text: tokenizer.encode(text, add_special_tokens=False), self._reply,
                         tokenizer.convert_tokens_to_ids(IM_END))

    def _chance(self, prompt: str) -> float:
        skill = prompt.partition(HEADERS["en"])[2].partition(IM_END)[0]
        chance = BASE_CHANCE + UPDATED * (self.weight_version > 0)
        for line in (line[2:] for line in skill.splitlines() if line.startswith("- ")):
            chance += sum(e for text, e in self._initial.items() if text in line)
            chance += EDIT_EFFECT * (line not in self._initial)
        return chance

    def _start(self, session: str, ids: Sequence[int]) -> tuple[ShopEnv, _FirstResult | _Oracle]:
        prompt = self._tokenizer.decode(ids)
        task = self._tasks[_INSTRUCTION.search(prompt).group(1)]
        # An episode's luck is its own, except that the siblings of a group (episodes g*G .. g*G+G-1
        # of a batch) share theirs once the policy has been updated: only the first step's groups
        # have reward variance, so one GRPO update runs (each new batch shape would cost another
        # compile of the update, ~15 s on two cores).
        batch, _, index = session.rpartition("-")
        luck = (_uniform("episode", session) if self.weight_version == 0
                else _uniform("group", batch, int(index) // self._group_size, self.weight_version))
        if (_uniform("task", task) + luck) / 2 < self._chance(prompt):
            player = _Oracle()
        else:
            player = _Pager() if _uniform("pager", task) < PAGERS else _FirstResult()
        env = ShopEnv(self._world)
        player.reset(env, env.reset(task).observation)
        return env, player

    def _reply(self, session: str, ids: Sequence[int]) -> str:
        if session not in self._episodes:
            self._episodes[session] = self._start(session, ids)
        env, player = self._episodes[session]
        action = player.act(env, "")
        env.step(action)
        return format_tool_calls([from_env_action(action)], "xml")

    def release(self, session: str) -> None:
        super().release(session)
        self._episodes.pop(session, None)


@dataclasses.dataclass(frozen=True)
class TinyRun:
    config: runconfig.RunConfig
    run: Path  # finished: trained and evaluated
    partial: Path  # as killed in round 1: gate 0 closed, step 3 done, no evaluation
    fresh: Path  # as killed after the first step: no gate, no evaluation


def build(root: Path) -> TinyRun:
    config = runconfig.with_overrides(runconfig.load_file(SMOKE), OVERRIDES)
    assert config.sim.catalog.lang == "en" and config.sim.env.mode == "single", "the script reads English prompts"
    world = build_world(config.sim)
    base = policy.prepare_policy(config, root / "policy", world)
    config = runconfig.with_overrides(config, {"policy.path": str(base)})
    tokenizer = policy.load_tokenizer(base, config.for_policy(base).agent)
    initial = SkillBank.load(runconfig.resolve_repo_path(config.skills.initial))
    engine = SkillfulScript(tokenizer, world, initial, config.train.group_size)
    run, snapshots = root / "run", {name: root / name for name in SNAPSHOTS.values()}
    reached = rundir.reached

    def snapshot_at_commit(phase: str) -> None:
        reached(phase)
        if phase != "checkpoint_commit":
            return
        name = SNAPSHOTS.get(max(row["step"] for row in rundir.read_jsonl(rundir.metrics_path(run))))
        if name and not snapshots[name].exists():
            # Orbax is still writing this step's checkpoint: the records are what a kill leaves.
            shutil.copytree(run, snapshots[name], ignore=shutil.ignore_patterns("checkpoints"))

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rundir, "reached", snapshot_at_commit)
        loop = coevolve.Coevolution.start(config, run, progress=False, world=world, engine=engine)
        try:
            loop.run()
        finally:
            loop.close()
    evaluate(config, run, world=world, progress=False, engine=engine)
    return TinyRun(config, run, snapshots["partial"], snapshots["fresh"])
