"""The outer loop: skill-model co-evolution, round by round.

    policy  = warm_start(prepare_policy())           # HF directories: base/, sft/hf/
    bank_0  = skills/s0                               # saved as skills/round_0/
    for round r in 0..R-1:
        for gate_every steps:                          # rl.learner.Learner
            contexts  <- sample_contexts(bank_r)       # one mask per group, 20% skill-free
            rollouts  <- policy under each context; all-wrong groups retried with the full bank
            GRPO update on groups with reward variance; weights pushed to the rollout engine
        checkpoint                                     # round ends are always saved
        proposals <- analysts(remaining failures of the round)
        gate      <- bare / random-mask / full arms on the validation tasks at this checkpoint
        bank_r+1  <- decide(bank_r, proposals, contributions)   # skills/round_{r+1}/ is the commit

Resumption: the newest checkpoint gives the step; the newest `skills/round_K/ledger.json` gives the
bank. A gate that was running when the run died is run again from the same checkpoint with the same
seeds (its partial records are dropped first), so a resumed run makes the same decisions.
Sampling, masks, the gate and the analysts draw from generators seeded by (seed, step or round),
never from state that a kill would lose.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
from etils import epath

from sim.env import ShopEnv
from sim.world import World, build_world

from intraskill_jax import allocator, distributed, provenance, rundir
from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.progress import Progress, as_progress
from intraskill_jax.policy import default_mesh, load_policy, load_tokenizer, play, prepare_policy
from intraskill_jax.rl.learner import Learner
from intraskill_jax.rl.rollouts import Experience
from intraskill_jax.rollout.base import RolloutEngine, WeightUpdate
from intraskill_jax.rollout.factory import make_engine
from intraskill_jax.runconfig import RunConfig, resolve_repo_path
from intraskill_jax.skills.analysts import make_analyst, propose
from intraskill_jax.skills.bank import SkillBank
from intraskill_jax.skills.gate import Outcome, run_gate
from intraskill_jax.skills.masks import retry_context, sample_contexts
from intraskill_jax.warm_start import warm_start

log = logging.getLogger(__name__)

# Seed streams: each random decision draws from default_rng([seed, stream, index]).
# (stream 5 is the warm start's demonstrations, warm_start.py)
_MASKS, _GATE, _ANALYSTS, _GATE_SAMPLING = 1, 2, 3, 4


# -- the loop --------------------------------------------------------------------------------------


class Coevolution:
    """One training run in `workdir`; `run()` trains to the end (resuming whatever is there)."""

    def __init__(self, config: RunConfig, workdir: rundir.PathLike, policy_path: rundir.PathLike, *, world: World,
                 progress: bool | Progress = True, mesh: Any = None, engine: RolloutEngine | None = None):
        """The loop on the starting policy at `policy_path` (see `start`); constructing it loads the
        policy and restores the newest checkpoint, it trains nothing. `engine` replaces the
        configured rollout engine (e.g. a scripted policy in a test)."""
        self.workdir, self.world = rundir.run_path(workdir), world
        self.progress = as_progress(progress)
        _check_config_unchanged(config, self.workdir)
        # The agent's tool-call format follows the policy's model family (its config.json).
        self.config = config = config.for_policy(policy_path)
        self.lang = config.sim.catalog.lang
        self.policy_path = rundir.run_path(policy_path)
        self.tokenizer = load_tokenizer(self.policy_path, config.agent)
        mesh = default_mesh(config) if mesh is None else mesh
        model = load_policy(config, self.policy_path, mesh)
        self.engine = engine if engine is not None else make_engine(
            config.rollout, WeightUpdate.published(0, self.policy_path, lambda: model))
        self.analyst = make_analyst(config.skills)
        self.validation = [int(t) for t in self.world.splits.validation[: config.skills.validation_tasks]]
        self.bank = self._load_bank()
        self.learner = Learner(
            model, self.tokenizer, self.engine, self.workdir, tasks=self.world.splits.train,
            make_env=lambda: ShopEnv(self.world), config=config.train, sampling=config.rollout.sampling,
            agent=config.agent, max_concurrent=config.rollout.capacity, mesh=mesh,
            contexts_fn=self._contexts, retry_fn=self._retry, on_step=self._record_step,
            checkpoint_extra=lambda: {"bank_round": self.bank.round})
        if self.learner.step and self._gate_pending(self.learner.step):
            # The gate at this step had started when the run died: drop what it wrote, redo it.
            self.learner.metrics.rewind(lambda row: row["step"] == self.learner.step
                                        and any(k.startswith("gate/") for k in row))

    @classmethod
    def start(cls, config: RunConfig, workdir: rundir.PathLike, *, progress: bool | Progress = True,
              world: World | None = None, mesh: Any = None, engine: RolloutEngine | None = None) -> Coevolution:
        """Prepares the run's starting policy (the base model, then the warm start's SFT, each
        skipped when already done in `workdir`) and returns the loop on it."""
        workdir, progress = rundir.run_path(workdir), as_progress(progress)
        _check_config_unchanged(config, workdir)  # before any work: a resumed run keeps its config
        with progress.stage("setup", 1) as bar, provenance.stage(workdir, "setup"):
            world = world or build_world(config.sim)
            base = prepare_policy(config, workdir, world)
            bar.update()
        provenance.record_session(workdir, "train", world)
        mesh = default_mesh(config) if mesh is None else mesh
        # The warm start keeps the base's family, so the agent's tool-call format is read once.
        with provenance.stage(workdir, "warm start", enabled=config.warm_start.enabled):
            policy_path = warm_start(config.for_policy(base), workdir, base, world, progress=progress, mesh=mesh)
        # The warm start's programs and freed buffers go before the loop's model, sampler cache and
        # update allocate theirs, not on top of them (SmolLM2's first timed run, before remat, was
        # OOM-killed 20 s into the loop with 24 GB resident).
        jax.clear_caches()
        allocator.release_free_memory()
        return cls(config, workdir, policy_path, world=world, progress=progress, mesh=mesh, engine=engine)

    # -- state -------------------------------------------------------------------------------------

    def _load_bank(self) -> SkillBank:
        k = rundir.latest_round(self.workdir)
        if k is not None:
            return SkillBank.load_round(self.workdir, k)
        bank = SkillBank.load(resolve_repo_path(self.config.skills.initial))
        if bank.round != 0:
            bank = dataclasses.replace(bank, round=0)
        bank.save_round(self.workdir)
        return bank

    def _round_of(self, step: int) -> int:
        return step // self.config.train.gate_every

    def _gate_pending(self, step: int) -> bool:
        """A round ended at `step` and its gate has not committed the next bank yet."""
        return (self.config.skills.mode == "coevolve" and step > 0 and step % self.config.train.gate_every == 0
                and self.bank.round < self._round_of(step))

    # -- learner hooks -----------------------------------------------------------------------------

    def _contexts(self, step: int, tasks: Sequence[int]) -> list[SkillContext]:
        if self.config.skills.mode == "none":
            return [SkillContext() for _ in tasks]
        rng = np.random.default_rng([self.config.train.seed, _MASKS, step])
        return sample_contexts(self.bank, len(tasks), rng, self.lang, self.config.skills.masks)

    def _retry(self, step: int) -> SkillContext | None:
        if self.config.skills.mode == "none" or not self.config.skills.retry or not self.bank.active:
            return None
        return retry_context(self.bank, self.lang)

    def _record_step(self, step: int, exp: Experience) -> dict[str, float]:
        """Writes the step's episodes (`rollouts/step_NNNNNN.jsonl`): behaviour, outcome, trace."""
        trajs = exp.trajectories
        first = int((~exp.retried).sum()) if len(exp.retried) else len(trajs)
        recovered_tasks = {trajs[i].task_id for i in range(first, len(trajs)) if trajs[i].success}
        wrong = {t.group for t in trajs[:first]} - {t.group for t in trajs[:first] if t.success}
        rows = []
        for i, t in enumerate(trajs):
            retry = i >= first
            rows.append({**rundir.episode_trace(t), "step": step, "round": self._round_of(step),
                         "admitted": bool(exp.admitted[i]), "advantage": float(exp.advantages[i]), "retry": retry,
                         "recovered_by_retry": (not retry and t.group in wrong and t.task_id in recovered_tasks)})
        rundir.write_jsonl(rundir.rollouts_path(self.workdir, step), rows)
        return {}

    # -- the loop ----------------------------------------------------------------------------------

    def run(self) -> SkillBank:
        """Trains to the last step; returns the final bank (S_T)."""
        learner, t = self.learner, self.config.train
        bar = self.progress.stage("co-evolution", t.steps, unit="step", initial=learner.step)
        if self._gate_pending(learner.step):
            self.gate()
        # The wall time of each round's training steps (checkpoints included), for the report; a
        # round always ends at a gate step (steps = rounds x gate_every).
        started, first = time.perf_counter(), learner.step + 1
        while learner.step < t.steps:
            m = learner.train_step()
            bar.update(round=self.bank.round, chunks=len(self.bank.active),
                       admitted=f"{m.get('rollout/episodes_admitted', 0):.0f}/{m.get('rollout/episodes_generated', 0):.0f}")
            if learner.step % t.gate_every == 0:
                if learner.step % t.checkpoint_every and learner.step != t.steps:
                    learner.save_checkpoint()  # the gate always starts from a saved checkpoint
                learner.checkpoints.wait_until_finished()
                provenance.record_stage(self.workdir, "training", time.perf_counter() - started,
                                        round=self._round_of(learner.step - 1), steps=[first, learner.step])
                if self._gate_pending(learner.step):
                    self.gate()
                started, first = time.perf_counter(), learner.step + 1
        bar.close()
        self.export_final()
        return self.bank

    def export_final(self) -> epath.Path:
        """The trained policy as an HF directory, `<workdir>/hf/final/` (what evaluation loads)."""
        out = rundir.publish_policy(rundir.final_policy_dir(self.workdir), self.learner.model(), self.tokenizer,
                                    hf_config=self.learner.hf_config)
        rundir.write_json(rundir.final_record_path(self.workdir), {"step": self.learner.step, "bank_round": self.bank.round})
        return out

    def gate(self) -> SkillBank:
        """Closes the current round: analysts, the three-arm validation, the decision, the commit."""
        with (self.progress.stage("gate", self.config.train.rounds, unit="round", initial=self.bank.round) as bar,
              provenance.stage(self.workdir, "gate", round=self.bank.round, step=self.learner.step)):
            bank = self._gate()
            bar.update(chunks=len(bank.active))
        return bank

    def _gate(self) -> SkillBank:
        cfg, step, bank = self.config, self.learner.step, self.bank
        r = bank.round
        rows = self._round_rows(r)
        failures, recovered, funnel_failures = self._remaining_failures(rows, r)
        trajs = failures + [rundir.trajectory_from_trace(row) for row in rows
                            if row["success"] and not row["retry"]]
        # An analyst may call an LLM: process 0 asks, every process gets its proposals.
        batch = distributed.from_main(lambda: propose(trajs, bank, self.analyst,
                                                      np.random.default_rng([cfg.train.seed, _ANALYSTS, r]),
                                                      config=cfg.skills.analysts, lang=self.lang))
        episodes: list[tuple[str, Trajectory]] = []
        n = len(self.validation)

        def evaluate(task_ids: Sequence[int], contexts: Sequence[SkillContext]) -> list[Outcome]:
            trajs = play(self.engine, self.world, self.tokenizer, cfg, task_ids, contexts, cfg.rollout.sampling,
                         prefix=f"gate{r}", seed=(cfg.train.seed, _GATE_SAMPLING * 1_000_000 + r))
            arms = ["bare"] * n + ["random"] * n + ["full"] * (len(trajs) - 2 * n)
            episodes.extend(zip(arms, trajs))
            return [Outcome(t.reward, t.success) for t in trajs]

        result = run_gate(evaluate, bank, batch.proposals, self.validation,
                          np.random.default_rng([cfg.train.seed, _GATE, r]), config=cfg.skills.gate, lang=self.lang)
        funnel = {"failures": funnel_failures, "recovered_by_retry": recovered, **result.funnel(batch)}
        c = result.contributions
        rundir.write_jsonl(rundir.gate_episodes_path(self.workdir, r), [
            {**rundir.episode_record(t), "arm": arm, "round": r, "step": step,
             "mask": list(t.skill_mask)} for arm, t in episodes])
        rundir.write_json(rundir.gate_path(self.workdir, r), result.record(bank, batch, funnel, r, step))
        metrics = dict(result.metrics)
        metrics.update({f"gate/funnel_{k}": float(v) for k, v in funnel.items()})
        for j, col in enumerate(result.columns):
            if math.isfinite(c.beta[j]):
                metrics[f"gate/beta/{col}"] = float(c.beta[j])
        self.learner.metrics.write(step, metrics)
        nxt = result.bank
        self.learner.metrics.text(step, f"skills/round_{nxt.round}", _bank_markdown(nxt, self.lang))
        rundir.reached("gate_recorded")
        nxt.save_round(self.workdir)  # ledger.json last: the commit point of the round
        rundir.reached("bank_committed")
        self.bank = nxt
        log.info("round %d closed at step %d: %d -> %d active chunks, %d proposals, %d accepted",
                 r, step, len(bank.active), len(nxt.active), len(batch.proposals), funnel["accepted"])
        return nxt

    def _round_rows(self, r: int) -> list[dict[str, Any]]:
        ge = self.config.train.gate_every
        rows = []
        for s in range(r * ge, (r + 1) * ge):
            path = rundir.rollouts_path(self.workdir, s)
            if not path.is_file():
                raise FileNotFoundError(f"{path} is missing: the episodes of step {s} are needed by round {r}'s gate")
            rows += rundir.read_jsonl(path)
        return rows

    def _remaining_failures(self, rows: list[dict[str, Any]], r: int) -> tuple[list[Trajectory], int, int]:
        """Failures not recovered by a retry (a seeded sample of at most max_failures_analysed)."""
        first_pass = [row for row in rows if not row["retry"]]
        failures = [row for row in first_pass if not row["success"]]
        recovered = [row for row in failures if row["recovered_by_retry"]]
        remaining = [row for row in failures if not row["recovered_by_retry"]]
        cap = self.config.skills.max_failures_analysed
        if len(remaining) > cap:
            pick = np.random.default_rng([self.config.train.seed, _ANALYSTS, r, 1]).choice(len(remaining), cap, replace=False)
            remaining = [remaining[i] for i in sorted(pick)]
        groups_recovered = len({(row["step"], row["group"]) for row in recovered})
        return [rundir.trajectory_from_trace(row) for row in remaining], groups_recovered, len(failures)

    def close(self) -> None:
        self.learner.close()


def _bank_markdown(bank: SkillBank, lang: str) -> str:
    lines = [f"### {bank.name} (round {bank.round})"]
    lines += [f"- **{c.id}** ({c.title}): {c.text(lang)}" for c in bank.active]
    return "\n".join(lines)


def _check_config_unchanged(config: RunConfig, workdir: epath.Path) -> None:
    """A resumed run must use the config it started with (`config.json`); a changed one is an error.
    On several processes every one must then read process 0's `config.json`: the workdir must be
    storage they all see."""
    path = rundir.config_path(workdir)
    if path.is_file():
        if rundir.read_json(path) != json.loads(config.to_json()):
            raise ValueError(f"{workdir} holds a run with a different config ({path}); use a new --workdir "
                             "or the original config")
    else:
        rundir.write_json(path, config.to_dict())
    seen = distributed.all_processes(path.is_file())
    if not all(seen):
        raise ValueError(f"processes {[i for i, ok in enumerate(seen) if not ok]} do not see {path}, which process 0 "
                         "wrote: the workdir must be one storage every process sees (gs://, or a shared file system "
                         "without attribute caching)")
