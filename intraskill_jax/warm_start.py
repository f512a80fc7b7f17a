"""The warm start: SFT of the starting policy on oracle demonstrations, before any GRPO step.

The oracle's episodes are rendered by the agent loop itself under training-like skill masks, so
the demonstration tokens are exactly what the policy will have to sample. The result is an HF
directory, `<workdir>/sft/hf/`; a killed SFT resumes from its own checkpoints under `<workdir>/sft/`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
from etils import epath

from sim.env import ShopEnv
from sim.policies import RecoveringOraclePolicy
from sim.world import World

from intraskill_jax import rundir
from intraskill_jax.agent.demos import oracle_demonstrations
from intraskill_jax.agent.episode import SkillContext, group_specs
from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.policy import load_policy, load_tokenizer
from intraskill_jax.progress import Progress, as_progress
from intraskill_jax.runconfig import RunConfig, resolve_repo_path
from intraskill_jax.skills.bank import SkillBank
from intraskill_jax.skills.masks import sample_contexts

log = logging.getLogger(__name__)

# The demonstrations' seed stream: default_rng([seed, _DEMOS, k]) (coevolve.py holds streams 1-4),
# k = 0 for the training demonstrations, 1 for the held-out runs, 2 for the recovery mistakes.
_DEMOS = 5


def oracle_runs(config: RunConfig, world: World, tokenizer, task_ids: Sequence[int], *,
                heldout: bool) -> list[Trajectory]:
    """The oracle's episodes on `task_ids`, rendered by the agent loop under training-like skill
    masks (seeded by the run's seed, one stream for the demonstrations and one for held-out runs).
    A `warm_start.recovery_share` of the demonstrations (never the held-out runs) recover from a
    mistake first."""
    rng = np.random.default_rng([config.train.seed, _DEMOS, int(heldout)])
    if config.skills.mode != "none":
        bank = SkillBank.load(resolve_repo_path(config.skills.initial))
        contexts = sample_contexts(bank, len(task_ids), rng, config.sim.catalog.lang, config.skills.masks)
    else:
        contexts = [SkillContext()] * len(task_ids)
    specs = group_specs(task_ids, contexts)
    mistakes = None if heldout else recovery_mistakes(len(specs), config.warm_start.recovery_share,
                                                      np.random.default_rng([config.train.seed, _DEMOS, 2]))
    return oracle_demonstrations([ShopEnv(world) for _ in specs], tokenizer, specs, config.agent, mistakes=mistakes)


def recovery_mistakes(n: int, share: float, rng: np.random.Generator) -> list[str | None]:
    """Which of `n` demonstrations make a mistake first: round(share * n) of them, drawn by `rng`,
    the kinds alternating ('buy_early', 'wrong_product', ...); None for the oracle's own."""
    out: list[str | None] = [None] * n
    for k, i in enumerate(sorted(rng.choice(n, size=round(share * n), replace=False))):
        out[i] = RecoveringOraclePolicy.MISTAKES[k % len(RecoveringOraclePolicy.MISTAKES)]
    return out


def heldout_runs(config: RunConfig, world: World, tokenizer) -> list[Trajectory]:
    """The runs the warm start is scored on: the oracle on the first `warm_start.heldout_demos`
    validation tasks (`eval/sft_agree_<kind>` in `<workdir>/sft/metrics.jsonl`)."""
    return oracle_runs(config, world, tokenizer, world.splits.validation[: config.warm_start.heldout_demos],
                       heldout=True)


def warm_start(config: RunConfig, workdir: rundir.PathLike, base: epath.Path, world: World, *,
               progress: bool | Progress = True, mesh: Any = None) -> epath.Path:
    """SFT on oracle demonstrations (rendered by the agent loop under training-like skill masks).

    Returns the HF directory of the warm-started policy, `<workdir>/sft/hf/` (or `base` when the
    warm start is off). A killed SFT resumes from its own checkpoints under `<workdir>/sft/`.
    """
    ws = config.warm_start
    if not ws.enabled:
        return base
    out = rundir.sft_policy_dir(workdir)
    if rundir.is_published(out):
        return out
    progress = as_progress(progress)
    with progress.stage("sft", unit="update"):  # the demonstrations and the held-out scoring too
        return _warm_start(config, rundir.sft_dir(workdir), out, base, world, progress, mesh)


def _warm_start(config: RunConfig, sft_dir: epath.Path, out: epath.Path, base: epath.Path, world: World,
                progress: Progress, mesh: Any) -> epath.Path:
    from intraskill_jax.checkpoint import Checkpointer
    from intraskill_jax.metrics import MetricsWriter
    from intraskill_jax.rl.sft import oracle_agreement, run_sft

    ws = config.warm_start
    tokenizer = load_tokenizer(base, config.agent)
    demos = [d for d in oracle_runs(config, world, tokenizer, world.splits.train[: ws.num_demos], heldout=False)
             if d.success]
    if not demos:
        raise ValueError(f"no oracle demonstration succeeded within agent.max_turns={config.agent.max_turns} and "
                         f"agent.max_context_tokens={config.agent.max_context_tokens}; raise them")
    log.info("warm start on %d successful oracle demonstrations", len(demos))
    model = load_policy(config, base, mesh)
    with Checkpointer(rundir.checkpoints_dir(sft_dir)) as ckpt, \
            MetricsWriter(sft_dir, rewind_to=ckpt.latest_step() or 0) as writer:
        # A killed warm start resumes at its newest checkpoint: the rows logged after it, and the
        # held-out scoring that follows the last update, are written again.
        writer.rewind(lambda row: any(key.startswith("eval/") for key in row))
        result = run_sft(model, demos, ws.sft, pad_id=tokenizer.pad_token_id, mesh=mesh, writer=writer,
                         checkpointer=ckpt, progress=progress)
        heldout = heldout_runs(config, world, tokenizer) if ws.heldout_demos else []
        if heldout:
            agree = oracle_agreement(model, heldout, world.catalog, pad_id=tokenizer.pad_token_id,
                                     result_labels=config.sim.env.result_labels)
            writer.write(int(result.state.step), {f"eval/sft_agree_{k}": v for k, v in agree.items()})
            log.info("warm start on %d held-out oracle runs: chance of sampling the oracle's action: %s", len(heldout),
                     ", ".join(f"{k} {v:.2f}" for k, v in agree.items()))
    return rundir.publish_policy(out, model, tokenizer)
