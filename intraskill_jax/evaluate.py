"""The test conditions: base and trained policy, each with and without a skill, on the same tasks.

    base_bare      the starting policy (after the warm start), bare prompt
    base_skill     the starting policy with the initial bank S0 (every chunk on)
    trained_bare   the trained policy, bare prompt
    trained_skill  the trained policy with the final bank S_T (every chunk on)
    pretrained_bare, pretrained_skill (optional): the starting checkpoint before the warm start,
                   bare and with S0: zero-shot, what a pretrained model does on a shop it never saw

Every condition plays the same first `eval.num_tasks` test tasks once, with the same sampling seed,
so outcomes pair task by task. Rows go to `<workdir>/eval/outcomes.jsonl` (one per condition and
task: the episode record plus condition, policy and skill); the paired analysis (flips, bootstrap
intervals, McNemar) reads them (`intraskill_jax.analysis.results`).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from etils import epath

from sim.world import World, build_world

from intraskill_jax import provenance, rundir, transcript
from intraskill_jax.policy import default_mesh, load_policy, load_tokenizer, play, prepare_policy
from intraskill_jax.progress import Progress, as_progress
from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.rollout.base import RolloutEngine, WeightUpdate
from intraskill_jax.rollout.factory import make_engine
from intraskill_jax.runconfig import CONDITIONS, PRETRAINED_CONDITIONS, RunConfig, resolve_repo_path
from intraskill_jax.skills.bank import SkillBank

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Condition:
    name: str
    policy: str  # 'base', 'trained', 'pretrained' or an HF directory
    skill: str  # 'none', 'initial', 'final' or a skill directory
    mask: tuple[int, ...] | None = None  # a subset of the bank's active chunks (None: all of them)


DEFAULT = {
    "base_bare": Condition("base_bare", "base", "none"),
    "base_skill": Condition("base_skill", "base", "initial"),
    "trained_bare": Condition("trained_bare", "trained", "none"),
    "trained_skill": Condition("trained_skill", "trained", "final"),
    "pretrained_bare": Condition("pretrained_bare", "pretrained", "none"),
    "pretrained_skill": Condition("pretrained_skill", "pretrained", "initial"),
}
assert tuple(DEFAULT) == CONDITIONS + PRETRAINED_CONDITIONS


def parse_condition(spec: str) -> Condition:
    """'name' (a known condition) or 'name=POLICY:SKILL' (POLICY: base|trained|pretrained|dir, SKILL:
    none|initial|final|dir)."""
    if "=" not in spec:
        if spec not in DEFAULT:
            raise ValueError(f"unknown condition {spec!r}; known: {list(DEFAULT)} or name=POLICY:SKILL")
        return DEFAULT[spec]
    name, _, pair = spec.partition("=")
    policy, sep, skill = pair.partition(":")
    if not (name and sep and policy and skill):
        raise ValueError(f"condition {spec!r} must look like name=POLICY:SKILL")
    return Condition(name, policy, skill)


def policy_path(config: RunConfig, workdir: rundir.PathLike, which: str, world: World) -> epath.Path:
    if which == "base":  # the policy training started from: the warm start if there was one
        sft = rundir.sft_policy_dir(workdir)
        return sft if rundir.is_published(sft) else prepare_policy(config, workdir, world)
    if which == "pretrained":  # the checkpoint itself, before any warm start
        return prepare_policy(config, workdir, world)
    if which == "trained":
        path = rundir.final_policy_dir(workdir)
        if not rundir.is_published(path):
            raise FileNotFoundError(f"{path} not found: training has not finished in {workdir} "
                                    "(run `intraskill train` first, or name a policy directory)")
        return path
    path = rundir.run_path(resolve_repo_path(which))
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"policy {which!r} is neither base, trained nor an HF directory")
    return path


def skill_bank(config: RunConfig, workdir: rundir.PathLike, which: str) -> SkillBank | None:
    if which == "none":
        return None
    if which == "initial":
        return (SkillBank.load_round(workdir, 0) if rundir.latest_round(workdir) is not None
                else SkillBank.load(resolve_repo_path(config.skills.initial)))
    if which == "final":
        k = rundir.latest_round(workdir)
        if k is None:
            raise FileNotFoundError(f"no skills/round_K/ under {workdir}: training has not started there")
        return SkillBank.load_round(workdir, k)
    return SkillBank.load(resolve_repo_path(which))


def evaluate(config: RunConfig, workdir: rundir.PathLike, conditions: Sequence[Condition] | None = None, *,
             world: World | None = None, progress: bool | Progress = True,
             out: rundir.PathLike | None = None, engine: RolloutEngine | None = None) -> list[dict[str, Any]]:
    """Plays every condition on the same test tasks; writes (to `out`, default eval/outcomes.jsonl)
    and returns the outcome rows. `engine` replaces the configured rollout engine (e.g. a scripted
    policy in a test); it is given each policy's weights in turn, as the configured one is."""
    progress = as_progress(progress)
    workdir = rundir.run_path(workdir)
    conditions = list(conditions or [DEFAULT[c] for c in config.eval.conditions])
    names = [c.name for c in conditions]
    if len(set(names)) != len(names):
        raise ValueError(f"condition names must be unique: {names}")
    world = world or build_world(config.sim)
    lang = config.sim.catalog.lang
    tasks = [int(t) for t in world.splits.test[: config.eval.num_tasks]]
    if len(tasks) < config.eval.num_tasks:
        raise ValueError(f"eval.num_tasks={config.eval.num_tasks} but the test split has {len(tasks)} tasks")
    # Resolve everything before playing anything: a missing policy fails in seconds, not an hour in.
    paths = {c.policy: policy_path(config, workdir, c.policy, world) for c in conditions}
    # Each policy's agent speaks its own family's tool calls (a mismatch with the config fails here).
    policy_configs = {policy: config.for_policy(path) for policy, path in paths.items()}
    banks = {c.skill: skill_bank(config, workdir, c.skill) for c in conditions}
    provenance.record_session(workdir, "eval", world)
    rows: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []  # a success and a failure per condition, whole, for the report
    mesh = default_mesh(config)
    for version, policy in enumerate(dict.fromkeys(c.policy for c in conditions)):
        path = paths[policy]
        tokenizer = load_tokenizer(path, policy_configs[policy].agent)
        # The model is loaded only for an engine that samples in process; a server loads `path`.
        weights = WeightUpdate.published(version, path, functools.partial(load_policy, config, path, mesh))
        if engine is None:
            engine = make_engine(config.rollout, weights)
        else:
            engine.update_weights(weights)
        for cond in (c for c in conditions if c.policy == policy):
            bank = banks[cond.skill]
            mask = None if bank is None else (cond.mask if cond.mask is not None else bank.full_mask())
            ctx = SkillContext(bank.render(mask, lang), mask) if bank is not None else SkillContext()
            # A stage per condition, told episode by episode: conditions differ in cost (the zero-shot
            # model's episodes end after a few unparsed replies, at a third of the others'), so each
            # is timed at its own rate once it runs.
            with (provenance.stage(workdir, "evaluation", condition=cond.name, episodes=len(tasks)),
                  progress.stage(evaluation_stage(cond.name), len(tasks), unit="episode") as bar):
                trajs = play(engine, world, tokenizer, policy_configs[policy], tasks, [ctx] * len(tasks),
                             config.eval.sampling, prefix=f"eval-{cond.name}", seed=(config.eval.seed, 0),
                             on_done=bar.update)
            traces += [{**transcript.episode_transcript(t, tokenizer, world.catalog.tasks[t.task_id]),
                        "condition": cond.name} for t in transcript.examples(trajs)]
            for t in trajs:
                rows.append({**rundir.episode_record(t), "condition": cond.name,
                             "policy": policy if policy in ("base", "trained") else str(path),
                             "skill": "none" if bank is None else bank.name,
                             "chunks": [] if bank is None else [c for c, on in zip(bank.active_ids, mask) if on]})
            success = sum(t.success for t in trajs) / len(trajs)
            log.info("%s: success %.3f over %d tasks", cond.name, success, len(trajs))
    rundir.write_jsonl(out or rundir.eval_outcomes_path(workdir), rows)
    rundir.reached("eval_recorded")
    if out is None:  # the default conditions' examples; another table (the ranking) keeps its own rows only
        rundir.write_jsonl(rundir.eval_traces_path(workdir), traces)
    return rows


def evaluation_stage(condition: str) -> str:
    """The progress stage that plays `condition` (`main.job_plan` plans one per condition)."""
    return f"evaluation {condition}"


def ranking_conditions(bank: SkillBank, k: int, seed: int = 0) -> list[Condition]:
    """The ranking appendix: the trained policy with the top-k, bottom-k and a random k of the final
    bank's chunks, ranked by their latest contribution estimate (chunks never estimated rank last)."""
    ids = bank.active_ids
    if not 0 < k <= len(ids):
        raise ValueError(f"k must be in [1, {len(ids)}] (the final bank's active chunks), got {k}")
    est = bank.estimates()
    beta = [est.get(c, {}).get("beta") for c in ids]
    order = sorted(range(len(ids)), key=lambda j: (beta[j] is None, -(beta[j] or 0.0), ids[j]))
    random = np.random.default_rng(seed).choice(len(ids), k, replace=False)

    def subset(idx: Sequence[int]) -> tuple[int, ...]:
        return tuple(int(j in set(int(i) for i in idx)) for j in range(len(ids)))

    top, bottom, rand, *default = ranking_names(k)
    return [Condition(top, "trained", "final", subset(order[:k])),
            Condition(bottom, "trained", "final", subset(order[-k:])),
            Condition(rand, "trained", "final", subset(random)),
            *(DEFAULT[name] for name in default)]


def ranking_names(k: int) -> list[str]:
    """The names of `ranking_conditions(bank, k)`, in order."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    return [f"top{k}", f"bottom{k}", f"random{k}", "trained_bare", "trained_skill"]
