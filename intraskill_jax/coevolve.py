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
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from sim.env import ShopEnv
from sim.world import World, build_world

from intraskill_jax import rundir
from intraskill_jax.agent.demos import oracle_agreement, oracle_demonstrations
from intraskill_jax.agent.episode import EpisodeSpec, run_episodes
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.progress import Progress, as_progress
from intraskill_jax.rl.learner import Learner
from intraskill_jax.rl.rollouts import Experience, GroupContext
from intraskill_jax.rollout.base import RolloutEngine, SamplingParams
from intraskill_jax.runconfig import RunConfig, resolve_repo_path
from intraskill_jax.skills.analysts import Analyst, OfflineAnalyst, propose
from intraskill_jax.skills.bank import SkillBank, latest_round
from intraskill_jax.skills.gate import run_gate
from intraskill_jax.skills.masks import retry_context, sample_contexts
from intraskill_jax.tokenization import ToolFormat

log = logging.getLogger(__name__)

# Seed streams: each random decision draws from default_rng([seed, stream, index]).
_MASKS, _GATE, _ANALYSTS, _GATE_SAMPLING, _DEMOS = 1, 2, 3, 4, 5


# -- the policy ------------------------------------------------------------------------------------


def prepare_policy(config: RunConfig, workdir: str | Path, world: World) -> Path:
    """The HF directory of the starting policy: `policy.path`, or a fresh model under `<workdir>/base/`.

    The fresh model is `ModelConfig.tiny_qwen3_5` under `policy.init` (a Qwen3.5-architecture
    network unless `init` names another family) with random weights and a byte-level BPE
    tokenizer trained on the simulator's text (titles, instructions, the skill bank, the tool
    prompt) whose template writes the family's tool calls, saved exactly as a downloaded
    checkpoint would be.
    """
    if config.policy.path:
        path = resolve_repo_path(config.policy.path)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"policy.path {path} has no config.json: point it at an HF checkpoint directory")
        return path
    base = Path(workdir) / "base"
    if (base / "config.json").is_file() and (base / "tokenizer.json").is_file():
        return base
    from flax import nnx

    from intraskill_jax.models import ModelConfig, get_family
    from intraskill_jax.models.params import save_pretrained
    from intraskill_jax.tokenization import train_tokenizer

    model_config = ModelConfig.tiny_qwen3_5(**config.policy.init)
    family = get_family(model_config.family)
    tokenizer = train_tokenizer(_corpus(config, world, family.tool_format), config.policy.tokenizer_vocab_size,
                                tool_format=family.tool_format, template=config.policy.chat_template)
    model_config = model_config.replace(vocab_size=len(tokenizer))
    model = family.model_class(model_config, rngs=nnx.Rngs(config.train.seed))
    _publish(base, lambda tmp: (save_pretrained(model, tmp), tokenizer.save_pretrained(tmp)))
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    log.info("fresh policy (%d parameters, vocab %d) saved to %s", n_params, len(tokenizer), base)
    return base


def _corpus(config: RunConfig, world: World, tool_format: ToolFormat, episodes: int = 300) -> list[str]:
    """What the policy will read and write: prompts, skill text, oracle episodes' pages and calls
    (written in `tool_format`)."""
    from transformers.utils.chat_template_utils import render_jinja_template

    from sim.policies import OraclePolicy

    from intraskill_jax.agent.prompts import system_prompt
    from intraskill_jax.tokenization import SPECIAL_TOKENS, chat_template, format_tool_calls, from_env_action, tools_for

    lang, mode = config.sim.catalog.lang, config.sim.env.mode
    bank = SkillBank.load(resolve_repo_path(config.skills.initial))
    # The system turn (tool schema, instructions, skill) opens every episode: weight it like the
    # pages beside it. Special tokens are single ids already, so they are not corpus text.
    rendered, _ = render_jinja_template(
        [[{"role": "system", "content": system_prompt(lang, mode, bank.render(bank.full_mask(), lang))}]],
        tools=tools_for(mode), chat_template=chat_template(tool_format, config.policy.chat_template),
        add_generation_prompt=True)
    system = rendered[0]
    for token in SPECIAL_TOKENS:
        system = system.replace(token, "\n")
    texts = [system] * episodes
    env = ShopEnv(world)
    for tid in world.splits.train[:episodes]:
        result = env.reset(int(tid))
        policy = OraclePolicy()
        policy.reset(env, result.observation)
        texts.append(result.observation)
        while not result.done:
            action = policy.act(env, result.observation)
            texts.append(format_tool_calls([from_env_action(action)], tool_format))
            result = env.step(action)
            texts.append(result.observation)
    return texts


def _publish(out: Path, write: Callable[[Path], Any]) -> Path:
    """Writes a directory under a temporary name and renames it: readers see all of it or nothing."""
    tmp = out.with_name(out.name + ".tmp")
    for stale in (tmp, out):
        if stale.exists():
            shutil.rmtree(stale)
    write(tmp)
    tmp.replace(out)
    return out


def load_policy(config: RunConfig, path: str | Path, mesh: Any = None) -> Any:
    from intraskill_jax.models.params import load_pretrained

    dtype = None if config.policy.dtype == "auto" else config.policy.dtype
    p = config.policy
    return load_pretrained(path, mesh=mesh, dtype=dtype, remat=p.remat, gdn_chunk_size=p.gdn_chunk_size,
                           attention_block_size=p.attention_block_size)


def load_tokenizer(path: str | Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))


def warm_start(config: RunConfig, workdir: str | Path, base: Path, world: World, *,
               progress: bool | Progress = True) -> Path:
    """SFT on oracle demonstrations (rendered by the agent loop under training-like skill masks).

    Returns the HF directory of the warm-started policy, `<workdir>/sft/hf/` (or `base` when the
    warm start is off). A killed SFT resumes from its own checkpoints under `<workdir>/sft/`.
    """
    ws = config.warm_start
    if not ws.enabled:
        return base
    sft_dir = Path(workdir) / "sft"
    out = sft_dir / "hf"
    if (out / "config.json").is_file():
        return out
    progress = as_progress(progress)
    with progress.stage("sft", unit="update"):  # the demonstrations and the held-out scoring too
        return _warm_start(config, sft_dir, base, world, progress)


def _warm_start(config: RunConfig, sft_dir: Path, base: Path, world: World, progress: Progress) -> Path:
    from intraskill_jax.checkpoint import Checkpointer
    from intraskill_jax.metrics import MetricsWriter
    from intraskill_jax.models.params import save_pretrained
    from intraskill_jax.rl.sft import run_sft

    ws, out = config.warm_start, sft_dir / "hf"
    tokenizer = load_tokenizer(base)
    lang = config.sim.catalog.lang
    bank = SkillBank.load(resolve_repo_path(config.skills.initial))

    def demonstrations(task_ids: Sequence[int], stream: int) -> list[Trajectory]:
        rng = np.random.default_rng([config.train.seed, _DEMOS, stream])
        contexts = (sample_contexts(bank, len(task_ids), rng, lang, config.skills.masks)
                    if config.skills.mode != "none" else [GroupContext()] * len(task_ids))
        specs = [EpisodeSpec(int(t), group=i, skill_text=c.skill_text, skill_mask=c.skill_mask)
                 for i, (t, c) in enumerate(zip(task_ids, contexts))]
        return oracle_demonstrations([ShopEnv(world) for _ in specs], tokenizer, specs, config.agent)

    demos = [d for d in demonstrations(world.splits.train[: ws.num_demos], 0) if d.success]
    if not demos:
        raise ValueError(f"no oracle demonstration succeeded within agent.max_turns={config.agent.max_turns} and "
                         f"agent.max_context_tokens={config.agent.max_context_tokens}; raise them")
    log.info("warm start on %d successful oracle demonstrations", len(demos))
    model = load_policy(config, base)
    with MetricsWriter(sft_dir) as writer, Checkpointer(sft_dir / "checkpoints") as ckpt:
        result = run_sft(model, demos, ws.sft, pad_id=tokenizer.pad_token_id, writer=writer, checkpointer=ckpt,
                         progress=progress)
        heldout = demonstrations(world.splits.validation[: ws.heldout_demos], 1) if ws.heldout_demos else []
        if heldout:
            agree = oracle_agreement(model, heldout, world.catalog, pad_id=tokenizer.pad_token_id,
                                     result_labels=config.sim.env.result_labels)
            writer.write(int(result.state.step), {f"eval/sft_agree_{k}": v for k, v in agree.items()})
            log.info("warm start on %d held-out oracle runs: chance of sampling the oracle's action: %s", len(heldout),
                     ", ".join(f"{k} {v:.2f}" for k, v in agree.items()))
    return _publish(out, lambda tmp: (save_pretrained(model, tmp), tokenizer.save_pretrained(tmp)))


def make_engine(config: RunConfig, model: Any) -> RolloutEngine:
    if config.rollout.engine == "sglang":
        from intraskill_jax.rollout.sglang import SGLangEngine

        return SGLangEngine(config.rollout.url)
    from intraskill_jax.rollout.jax_sampler import JaxSampler

    return JaxSampler(model, config.rollout.sampler)


def make_analyst(config: RunConfig) -> Analyst:
    if config.skills.analyst == "openai":
        from intraskill_jax.skills.analyst_openai import OpenAIAnalyst

        return OpenAIAnalyst(config.skills.analyst_url, config.skills.analyst_model)
    return OfflineAnalyst()


def play(engine: RolloutEngine, world: World, tokenizer: Any, config: RunConfig, task_ids: Sequence[int],
         contexts: Sequence[GroupContext], sampling: SamplingParams, *, prefix: str,
         seed: Sequence[int]) -> list[Trajectory]:
    """One episode per (task, context), seeded so the same call replays the same episodes."""
    if hasattr(engine, "reseed"):
        engine.reseed(*seed)
    specs = [EpisodeSpec(int(t), group=i, skill_text=c.skill_text, skill_mask=c.skill_mask)
             for i, (t, c) in enumerate(zip(task_ids, contexts))]
    return run_episodes(engine, [ShopEnv(world) for _ in specs], tokenizer, specs, sampling, config.agent,
                        episode_prefix=prefix, max_concurrent=config.rollout.capacity)


# -- the loop --------------------------------------------------------------------------------------


class Coevolution:
    """One training run in `workdir`; `run()` trains to the end (resuming whatever is there)."""

    def __init__(self, config: RunConfig, workdir: str | Path, *, progress: bool | Progress = True,
                 world: World | None = None, mesh: Any = None, engine: RolloutEngine | None = None):
        """`engine` replaces the configured rollout engine (e.g. a scripted policy in a test)."""
        self.workdir = Path(workdir)
        self.progress = progress = as_progress(progress)
        self.workdir.mkdir(parents=True, exist_ok=True)
        _check_config_unchanged(config, self.workdir)
        with progress.stage("setup", 1) as bar:
            self.world = world or build_world(config.sim)
            self.lang = config.sim.catalog.lang
            base = prepare_policy(config, self.workdir, self.world)
            # The warm start keeps the base's family, so the agent's tool-call format is read once.
            self.config = config = config.for_policy(base)
            bar.update()
        self.policy_path = warm_start(config, self.workdir, base, self.world, progress=progress)
        self.tokenizer = load_tokenizer(self.policy_path)
        # Accelerators shard over the configured mesh; CPU "devices" are test fakes (or host
        # threads) that sharding would only slow down.
        if mesh is None and jax.device_count() > 1 and (jax.default_backend() != "cpu" or jax.process_count() > 1):
            from intraskill_jax.models.sharding import make_mesh

            mesh = make_mesh(config.mesh)
        model = load_policy(config, self.policy_path, mesh)
        self.engine = engine if engine is not None else make_engine(config, model)
        self.analyst = make_analyst(config)
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

    # -- state -------------------------------------------------------------------------------------

    def _load_bank(self) -> SkillBank:
        k = latest_round(self.workdir)
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

    def _contexts(self, step: int, tasks: Sequence[int]) -> list[GroupContext]:
        if self.config.skills.mode == "none":
            return [GroupContext() for _ in tasks]
        rng = np.random.default_rng([self.config.train.seed, _MASKS, step])
        return sample_contexts(self.bank, len(tasks), rng, self.lang, self.config.skills.masks)

    def _retry(self, step: int) -> GroupContext | None:
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
        while learner.step < t.steps:
            m = learner.train_step()
            bar.update(round=self.bank.round, chunks=len(self.bank.active),
                       admitted=f"{m.get('rollout/episodes_admitted', 0):.0f}/{m.get('rollout/episodes_generated', 0):.0f}")
            if learner.step % t.gate_every == 0:
                if learner.step % t.checkpoint_every and learner.step != t.steps:
                    learner.save_checkpoint()  # the gate always starts from a saved checkpoint
                learner.checkpoints.wait_until_finished()
                if self._gate_pending(learner.step):
                    self.gate()
        bar.close()
        self.export_final()
        return self.bank

    def export_final(self) -> Path:
        """The trained policy as an HF directory, `<workdir>/hf/final/` (what evaluation loads)."""
        from intraskill_jax.models.params import save_pretrained

        model = self.learner.model()
        out = _publish(self.workdir / "hf" / "final", lambda tmp: (
            save_pretrained(model, tmp, hf_config=self.learner.hf_config), self.tokenizer.save_pretrained(tmp)))
        rundir.write_json(self.workdir / "hf" / "final.json", {"step": self.learner.step, "bank_round": self.bank.round})
        return out

    def gate(self) -> SkillBank:
        """Closes the current round: analysts, the three-arm validation, the decision, the commit."""
        with self.progress.stage("gate", self.config.train.rounds, unit="round", initial=self.bank.round) as bar:
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
        batch = propose(trajs, bank, self.analyst, np.random.default_rng([cfg.train.seed, _ANALYSTS, r]),
                        config=cfg.skills.analysts, lang=self.lang)
        episodes: list[tuple[str, Trajectory]] = []
        n = len(self.validation)

        def evaluate(task_ids: Sequence[int], contexts: Sequence[GroupContext]) -> list[float]:
            trajs = play(self.engine, self.world, self.tokenizer, cfg, task_ids, contexts, cfg.rollout.sampling,
                         prefix=f"gate{r}", seed=(cfg.train.seed, _GATE_SAMPLING * 1_000_000 + r))
            arms = ["bare"] * n + ["random"] * n + ["full"] * (len(trajs) - 2 * n)
            episodes.extend(zip(arms, trajs))
            return [t.reward for t in trajs]

        result = run_gate(evaluate, bank, batch.proposals, self.validation,
                          np.random.default_rng([cfg.train.seed, _GATE, r]), config=cfg.skills.gate, lang=self.lang)
        accepted = sum(d.kind == "proposal" and d.action in ("add", "rewrite") for d in result.decisions)
        funnel = {"failures": funnel_failures, "recovered_by_retry": recovered, "analysed": len(batch.reports),
                  "proposals": len(batch.proposals), "rejected": len(batch.rejected), "accepted": accepted}
        c = result.contributions
        doc = {
            "round": r, "step": step, "columns": list(result.columns),
            "kinds": ["chunk" if col in bank.active_ids else "proposal" for col in result.columns],
            "n": int(c.n), "beta": c.beta.tolist(), "se": c.se.tolist(), "ci_low": c.ci_low.tolist(),
            "ci_high": c.ci_high.tolist(), "p": c.p.tolist(),
            "decisions": [rundir.json_finite(dataclasses.asdict(d)) for d in result.decisions],
            "summary": rundir.json_finite({k.removeprefix("gate/"): v for k, v in result.metrics.items()}),
            "additivity": rundir.json_finite(dataclasses.asdict(result.additivity)) if result.additivity else None,
            "funnel": funnel,
            "proposals": [p.to_json() for p in batch.proposals],
            "rejected": [{"proposal": p.to_json(), "reasons": reasons} for p, reasons in batch.rejected],
            "analyst_counters": batch.counters,
        }
        rundir.write_jsonl(rundir.gate_episodes_path(self.workdir, r), [
            {**rundir.episode_record(t), "arm": arm, "round": r, "step": step,
             "mask": list(t.skill_mask)} for arm, t in episodes])
        rundir.write_json(rundir.gate_path(self.workdir, r), doc)
        metrics = dict(result.metrics)
        metrics.update({f"gate/funnel_{k}": float(v) for k, v in funnel.items()})
        for j, col in enumerate(result.columns):
            if math.isfinite(c.beta[j]):
                metrics[f"gate/beta/{col}"] = float(c.beta[j])
        self.learner.metrics.write(step, metrics)
        nxt = result.bank
        self.learner.metrics.text(step, f"skills/round_{nxt.round}", _bank_markdown(nxt, self.lang))
        nxt.save_round(self.workdir)  # ledger.json last: the commit point of the round
        self.bank = nxt
        log.info("round %d closed at step %d: %d -> %d active chunks, %d proposals, %d accepted",
                 r, step, len(bank.active), len(nxt.active), len(batch.proposals), accepted)
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


def _check_config_unchanged(config: RunConfig, workdir: Path) -> None:
    """A resumed run must use the config it started with (`config.json`); a changed one is an error."""
    path = workdir / "config.json"
    if path.is_file():
        if json.loads(path.read_text(encoding="utf-8")) != json.loads(config.to_json()):
            raise ValueError(f"{workdir} holds a run with a different config ({path}); use a new --workdir "
                             "or the original config")
        return
    rundir.write_json(path, config.to_dict())
