"""The validation gate: paired bare / random-mask validation on a frozen checkpoint, the
contribution fit, and the decision that turns round K's bank into round K+1's.

Arms, all on the same validation tasks, the same checkpoint and the same sampling settings:

* bare:   B_i, no skill (the bare prompt);
* random: R_i, every column (each active chunk and each pending proposal) on independently with
          p = 0.5: the only arm that feeds the regression R_i - B_i = C_i^T beta + e_i;
* full:   F_i, every column on, for the additivity check sum(beta) vs mean(F_i - B_i).

Decision rule (`GateConfig`; the ledger records every outcome with its estimate):

* A column *passes* under `rule`:
    'positive'        beta > min_effect                       (the original study: point estimates)
    'significant'     beta > min_effect and the effect is significant: ci_low > min_effect, or
                      with `bh`, BH-adjusted p < q over all columns
    'unless_harmful'  not significantly negative: ci_high >= 0, or with `bh`, not (beta < 0 and
                      adjusted p < q)
* A rewrite is accepted only if it passes and beats its target: beta_new > beta_old + rewrite_margin
  (the best such rewrite wins). The chunk keeps its id; its revision goes up.
* Otherwise an active chunk is retained if it passes and retired if not.
* An addition is accepted if it passes (it replaces nothing, i.e. it beats the bare prompt).
* With `max_active`, the lowest-beta survivors beyond the cap are retired.
* No decision without evidence: when the paired deltas R_i - B_i are all equal, or fewer tasks
  than `min_discordant` (default: columns + 1) have a non-zero delta, the fit cannot tell the
  columns apart. Then every active chunk is kept as it is, every proposal is rejected, and the
  ledger and the log say why.

The coefficients are selection scores for this checkpoint and this mask distribution, not causal
guarantees: chunks interact (Trace2Skill: "patch value is combinatorial"), which the additivity
check makes visible.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

from intraskill_jax import stats
from intraskill_jax.rundir import json_finite
from intraskill_jax.agent.episode import SkillContext
from intraskill_jax.skills.analysts import ProposalBatch
from intraskill_jax.skills.bank import Chunk, LedgerEntry, Proposal, SkillBank, render_texts

log = logging.getLogger(__name__)

Rule = Literal["positive", "significant", "unless_harmful"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateConfig:
    """The gate's arms and decision rule (see the module docstring).

    Attributes:
      inclusion: probability each column is on in the random-mask arm.
      full_arm: run the full-skill arm for the additivity check.
      rule: which columns pass ('positive', 'significant', 'unless_harmful').
      min_effect: margin a beta (or its interval) must clear to count as positive.
      rewrite_margin: how much a rewrite's beta must exceed its target's.
      bh: Benjamini-Hochberg at `q` replaces the raw intervals in the significance tests.
      q: BH false-discovery rate.
      alpha: 1 - confidence level of the reported intervals.
      cov_type: statsmodels robust covariance of the fit.
      max_active: cap on the number of active chunks after the decision (None: no cap).
      min_discordant: validation tasks whose paired delta must be non-zero before the gate may
        change the bank (0: the number of columns + 1, the fewest that can identify them).
      bootstrap_resamples: paired-bootstrap resamples for the summary gain (0 skips it).
      seed: seed of the bootstrap.
    """

    inclusion: float = 0.5
    full_arm: bool = True
    rule: Rule = "positive"
    min_effect: float = 0.0
    rewrite_margin: float = 0.0
    bh: bool = False
    q: float = 0.1
    alpha: float = 0.05
    cov_type: str = "HC3"
    max_active: int | None = None
    min_discordant: int = 0
    bootstrap_resamples: int = 2000
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.inclusion < 1.0:
            raise ValueError(
                f"inclusion must be in (0, 1) so every column varies, got {self.inclusion}"
            )
        if self.rule not in ("positive", "significant", "unless_harmful"):
            raise ValueError(
                f"rule must be 'positive', 'significant' or 'unless_harmful', got {self.rule!r}"
            )
        if not 0.0 < self.q < 1.0 or not 0.0 < self.alpha < 1.0:
            raise ValueError(f"q and alpha must be in (0, 1), got q={self.q}, alpha={self.alpha}")
        if self.max_active is not None and self.max_active < 0:
            raise ValueError(f"max_active must be >= 0 or None, got {self.max_active}")
        if self.min_discordant < 0:
            raise ValueError(f"min_discordant must be >= 0, got {self.min_discordant}")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """One validation episode's result: the training reward and whether the episode succeeded
    (the episode's own verdict, so the gate agrees with every other success rate of the run
    whichever reward is trained on)."""

    reward: float
    success: bool


Evaluate = Callable[[Sequence[int], Sequence[SkillContext]], Sequence[Outcome]]


@dataclasses.dataclass(frozen=True)
class ColumnDecision:
    column: str  # chunk id or proposal id
    kind: Literal["chunk", "proposal"]
    passes: bool
    action: str  # retain / retire / rewrite (on the target) / add / reject / superseded
    reason: str
    estimate: dict[str, float]


@dataclasses.dataclass(frozen=True)
class GateResult:
    bank: SkillBank  # the next round's bank, with its ledger
    columns: tuple[str, ...]
    contributions: stats.Contributions
    additivity: stats.Additivity | None
    decisions: tuple[ColumnDecision, ...]
    masks: np.ndarray  # [n, K] random-arm masks
    bare: np.ndarray  # [n] B_i
    random: np.ndarray  # [n] R_i
    full: np.ndarray | None  # [n] F_i
    metrics: dict[str, float]

    def funnel(self, batch: ProposalBatch) -> dict[str, int]:
        """How the analysts' proposals fared: analysed failures, proposals, rejects, accepted."""
        accepted = sum(d.kind == "proposal" and d.action in ("add", "rewrite") for d in self.decisions)
        return {"analysed": len(batch.reports), "proposals": len(batch.proposals), "rejected": len(batch.rejected),
                "accepted": accepted}

    def record(self, bank: SkillBank, batch: ProposalBatch, funnel: dict[str, int], round_: int,
               step: int) -> dict[str, Any]:
        """The round's JSON record (`gates/round_K.json`): the fit, every decision, the funnel and
        the proposals with the validators' rejects, for the report and the bundle."""
        c = self.contributions
        return {
            "round": round_, "step": step, "columns": list(self.columns),
            "kinds": ["chunk" if col in bank.active_ids else "proposal" for col in self.columns],
            "n": int(c.n), "beta": c.beta.tolist(), "se": c.se.tolist(), "ci_low": c.ci_low.tolist(),
            "ci_high": c.ci_high.tolist(), "p": c.p.tolist(),
            "decisions": [json_finite(dataclasses.asdict(d)) for d in self.decisions],
            "summary": json_finite({k.removeprefix("gate/"): v for k, v in self.metrics.items()}),
            "additivity": json_finite(dataclasses.asdict(self.additivity)) if self.additivity else None,
            "funnel": funnel,
            "proposals": [p.to_json() for p in batch.proposals],
            "rejected": [{"proposal": p.to_json(), "reasons": reasons} for p, reasons in batch.rejected],
            "analyst_counters": batch.counters,
        }


def decide(
    bank: SkillBank,
    proposals: Sequence[Proposal],
    contrib: stats.Contributions,
    config: GateConfig = GateConfig(),
    extra: dict[str, Any] | None = None,
) -> tuple[SkillBank, tuple[ColumnDecision, ...]]:
    """Applies the decision rule to a fit whose columns are `bank.active_ids` then `proposals`."""
    columns = [c.id for c in bank.active] + [p.id for p in proposals]
    if contrib.beta.shape[0] != len(columns):
        raise ValueError(
            f"fit has {contrib.beta.shape[0]} columns, the bank and proposals {len(columns)}"
        )
    estimates = [contrib.row(j) for j in range(len(columns))]
    if config.bh:
        _, p_adj = stats.benjamini_hochberg(contrib.p, config.q)
        for est, pa in zip(estimates, p_adj):
            est["p_adjusted"] = float(pa)
    judged = _Judged(dict(zip(columns, estimates)), {c: _passes(e, config) for c, e in zip(columns, estimates)})
    winners = _winning_rewrites(proposals, judged, config)
    out = _Next()
    for chunk in bank.chunks:
        if chunk.status != "active":
            out.chunks.append(chunk)
        else:
            _decide_chunk(chunk, winners.get(chunk.id), judged, config, out)
    existing = {c.id for c in bank.chunks}
    for prop in proposals:
        _decide_proposal(prop, winners, existing, judged, config, out)
    if config.max_active is not None and len(out.survivors) > config.max_active:
        out.cap(config.max_active)
    ledger_extra = {**(extra or {}), "rejected_proposals": out.rejected}
    return bank.next_version(out.chunks, out.entries, ledger_extra), tuple(out.decisions)


@dataclasses.dataclass(frozen=True)
class _Judged:
    estimates: dict[str, dict[str, float]]  # column -> its row of the fit
    passes: dict[str, bool]  # column -> passes the rule

    def beta(self, column: str) -> float:
        return float(self.estimates[column]["beta"])


@dataclasses.dataclass
class _Next:
    """The next bank as the decision builds it: chunks, ledger entries, per-column decisions."""

    chunks: list[Chunk] = dataclasses.field(default_factory=list)
    entries: list[LedgerEntry] = dataclasses.field(default_factory=list)
    decisions: list[ColumnDecision] = dataclasses.field(default_factory=list)
    survivors: list[tuple[float, str]] = dataclasses.field(default_factory=list)  # (beta, id) kept active
    rejected: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    def cap(self, max_active: int) -> None:
        """Retires the lowest-beta survivors beyond `max_active`, saying so in their ledger entries."""
        cut = {cid for _, cid in sorted(self.survivors, reverse=True)[max_active:]}
        self.chunks = [dataclasses.replace(c, status="retired") if c.id in cut else c for c in self.chunks]
        self.entries = [dataclasses.replace(e, action="retire", reason=f"{e.reason}; cut by max_active={max_active}")
                        if e.chunk_id in cut else e for e in self.entries]


def _winning_rewrites(proposals: Sequence[Proposal], judged: _Judged, config: GateConfig) -> dict[str, Proposal]:
    """Per target chunk, the passing rewrite with the highest beta above the target's + margin."""
    best: dict[str, Proposal] = {}
    for prop in proposals:
        if prop.op != "rewrite" or not judged.passes[prop.id]:
            continue
        if prop.target not in judged.passes:
            raise ValueError(f"proposal {prop.id} rewrites {prop.target!r}, which is not an active chunk")
        current = best.get(prop.target)
        if judged.beta(prop.id) > judged.beta(prop.target) + config.rewrite_margin and (
            current is None or judged.beta(prop.id) > judged.beta(current.id)
        ):
            best[prop.target] = prop
    return best


def _rule_reason(verdict: str, est: dict[str, float], config: GateConfig) -> str:
    return (f"{verdict} rule '{config.rule}' (beta {est['beta']:+.3f}, "
            f"CI [{est['ci_low']:+.3f}, {est['ci_high']:+.3f}])")


def _decide_chunk(chunk: Chunk, rewrite: Proposal | None, judged: _Judged, config: GateConfig, out: _Next) -> None:
    """An active chunk is rewritten (a winning rewrite), retained (passes) or retired."""
    est, passes = judged.estimates[chunk.id], judged.passes[chunk.id]
    if rewrite is not None:
        reason = (f"rewrite {rewrite.id} beta {judged.beta(rewrite.id):+.3f} beats the current text's "
                  f"{est['beta']:+.3f} by more than {config.rewrite_margin}")
        kept = dataclasses.replace(chunk, en=rewrite.en, zh=rewrite.zh, title=rewrite.title or chunk.title,
                                   revision=chunk.revision + 1)
        entry = LedgerEntry(chunk.id, "rewrite", reason, {**judged.estimates[rewrite.id], "replaced": est},
                            rewrite.trajectory_ids, rewrite.source, rewrite.id, {"en": chunk.en, "zh": chunk.zh})
        out.survivors.append((judged.beta(rewrite.id), chunk.id))
    elif passes:
        reason = _rule_reason("passes", est, config)
        kept, entry = chunk, LedgerEntry(chunk.id, "retain", reason, est)
        out.survivors.append((est["beta"], chunk.id))
    else:
        reason = _rule_reason("fails", est, config)
        kept, entry = dataclasses.replace(chunk, status="retired"), LedgerEntry(chunk.id, "retire", reason, est)
    out.chunks.append(kept)
    out.entries.append(entry)
    out.decisions.append(ColumnDecision(chunk.id, "chunk", passes, entry.action, reason, est))


def _decide_proposal(prop: Proposal, winners: dict[str, Proposal], existing: set[str], judged: _Judged,
                     config: GateConfig, out: _Next) -> None:
    """A rewrite is applied (by `_decide_chunk`), superseded or rejected; an addition added or rejected."""
    est, passes = judged.estimates[prop.id], judged.passes[prop.id]
    if prop.op == "rewrite":
        if winners.get(prop.target) is prop:
            action, reason = "rewrite", f"accepted as the new text of {prop.target}"
        elif passes:
            action, reason = "superseded", f"passes but does not beat {prop.target} or a better rewrite"
        else:
            action, reason = "reject", f"fails rule '{config.rule}'"
    elif prop.id in existing:
        action, reason = "reject", f"id {prop.id} already used"
    elif passes:
        action, reason = "add", f"passes rule '{config.rule}' (beta {est['beta']:+.3f})"
        out.chunks.append(Chunk(prop.id, prop.en, prop.zh, title=prop.title))
        out.entries.append(LedgerEntry(prop.id, "add", reason, est, prop.trajectory_ids, prop.source, prop.id))
        out.survivors.append((est["beta"], prop.id))
    else:
        action, reason = "reject", f"fails rule '{config.rule}'"
    out.decisions.append(ColumnDecision(prop.id, "proposal", passes, action, reason, est))
    if action in ("reject", "superseded"):
        out.rejected.append({**prop.to_json(), "estimate": est, "decision": action, "reason": reason})


def evidence(deltas: np.ndarray, num_columns: int, config: GateConfig = GateConfig()) -> tuple[bool, str]:
    """Whether paired deltas can separate `num_columns` contributions, and why (for the ledger)."""
    discordant = int(np.count_nonzero(deltas != 0.0))
    needed = config.min_discordant or num_columns + 1
    if deltas.size == 0 or np.ptp(deltas) == 0.0:
        value = float(deltas[0]) if deltas.size else 0.0
        return False, f"no evidence: all {deltas.size} paired deltas equal {value:+.3f}"
    if discordant < needed:
        return False, (f"no evidence: {discordant} of {deltas.size} tasks have a non-zero paired delta, "
                       f"fewer than the {needed} needed for {num_columns} columns")
    return True, f"{discordant} of {deltas.size} tasks have a non-zero paired delta"


def keep_bank(bank: SkillBank, proposals: Sequence[Proposal], contrib: stats.Contributions, why: str,
              extra: dict[str, Any] | None = None) -> tuple[SkillBank, tuple[ColumnDecision, ...]]:
    """The decision when the outcomes carry no information: the bank unchanged, proposals rejected."""
    decisions, entries, rejected = [], [], []
    for j, chunk in enumerate(bank.active):
        est = contrib.row(j)
        entries.append(LedgerEntry(chunk.id, "retain", f"kept unchanged, {why}", est))
        decisions.append(ColumnDecision(chunk.id, "chunk", False, "retain", f"kept unchanged, {why}", est))
    for j, prop in enumerate(proposals, start=len(bank.active)):
        est = contrib.row(j)
        decisions.append(ColumnDecision(prop.id, "proposal", False, "reject", f"not judged, {why}", est))
        rejected.append({**prop.to_json(), "estimate": est, "decision": "reject", "reason": f"not judged, {why}"})
    ledger_extra = {**(extra or {}), "rejected_proposals": rejected}
    return bank.next_version(bank.chunks, entries, ledger_extra), tuple(decisions)


def _passes(est: dict[str, float], config: GateConfig) -> bool:
    beta = est["beta"]
    if config.rule == "positive":
        return beta > config.min_effect
    if config.bh:
        significant = est["p_adjusted"] < config.q
        positive, negative = significant and beta > config.min_effect, significant and beta < 0
    else:
        positive, negative = est["ci_low"] > config.min_effect, est["ci_high"] < 0
    return positive if config.rule == "significant" else not negative


def draw_masks(n: int, k: int, p: float, rng: np.random.Generator, tries: int = 100) -> np.ndarray:
    """[n, k] independent Bernoulli(p) masks, redrawn in the rare case the fit would be degenerate.

    Degenerate: not full column rank, or a task with leverage 1 (the only one that separates two
    columns), where HC2/HC3 robust errors are undefined. Both are properties of the design alone,
    so redrawing before any episode runs costs nothing and biases nothing.
    """
    for _ in range(tries):
        masks = (rng.random((n, k)) < p).astype(np.int8)
        if k == 0:
            return masks
        x = masks.astype(np.float64)
        if np.linalg.matrix_rank(x) < k:
            continue
        leverage = np.einsum("ij,jk,ik->i", x, np.linalg.pinv(x.T @ x), x)
        if leverage.max() < 1.0 - 1e-9:
            return masks
    raise ValueError(
        f"could not draw identifiable masks for {k} columns over {n} tasks; use more tasks"
    )


def run_gate(
    evaluate: Evaluate,
    bank: SkillBank,
    proposals: Sequence[Proposal],
    validation_task_ids: Sequence[int],
    rng: np.random.Generator,
    *,
    config: GateConfig = GateConfig(),
    lang: str = "en",
) -> GateResult:
    """Runs the arms through `evaluate`, fits the contributions and decides the next bank.

    `evaluate(task_ids, contexts)` plays one episode per (task, context) on the frozen checkpoint
    and returns their `Outcome`s (the training reward and the episode's success). It is called once with all arms
    concatenated (bare, random, then full) so it can batch them. The gate's contexts carry masks
    over `columns` (active chunks, then proposals), not over the bank alone.
    """
    tasks = [int(t) for t in validation_task_ids]
    n = len(tasks)
    texts = [c.text(lang) for c in bank.active] + [p.text(lang) for p in proposals]
    columns = bank.active_ids + tuple(p.id for p in proposals)
    k = len(columns)
    if len(set(columns)) != k:
        raise ValueError(
            f"proposal ids must differ from each other and from active chunk ids: {columns}"
        )
    if n <= k + 1:
        raise ValueError(f"{n} validation tasks cannot identify {k} contributions; use more tasks")
    masks = draw_masks(n, k, config.inclusion, rng)

    def context(mask: Sequence[int]) -> SkillContext:
        return SkillContext(
            render_texts([t for t, on in zip(texts, mask) if on], lang), tuple(int(v) for v in mask)
        )

    contexts = [context((0,) * k)] * n + [context(m) for m in masks]
    arm_tasks = tasks * 2
    if config.full_arm:
        contexts += [context((1,) * k)] * n
        arm_tasks += tasks
    outcomes = list(evaluate(arm_tasks, contexts))
    if len(outcomes) != len(arm_tasks):
        raise ValueError(f"evaluate returned {len(outcomes)} outcomes for {len(arm_tasks)} episodes")
    rewards = np.asarray([o.reward for o in outcomes], np.float64)
    success = np.asarray([o.success for o in outcomes], bool)
    bare, random = rewards[:n], rewards[n : 2 * n]
    full = rewards[2 * n :] if config.full_arm else None
    contrib = stats.chunk_contributions(
        random - bare, masks, cov_type=config.cov_type, alpha=config.alpha, names=columns
    )
    additivity = stats.additivity_check(contrib, full - bare) if full is not None else None
    summary = _summary(rewards, success, n, config)
    extra = {
        "fit": {
            "columns": list(columns),
            "n": n,
            "cov_type": config.cov_type,
            "alpha": config.alpha,
            "beta": contrib.beta.tolist(),
            "se": contrib.se.tolist(),
            "masks_on_rate": masks.mean(0).tolist(),
        },
        "additivity": json_finite(dataclasses.asdict(additivity))
        if additivity is not None
        else None,
        "summary": json_finite(summary),
        "config": dataclasses.asdict(config),
        "validation_task_ids": tasks,
    }
    informative, why = evidence(random - bare, k, config)
    extra["evidence"] = {"informative": informative, "reason": why}
    if informative:
        next_bank, decisions = decide(bank, proposals, contrib, config, extra)
    else:
        log.warning("gate round %d: %s; the bank is kept unchanged and no proposal is judged", bank.round, why)
        next_bank, decisions = keep_bank(bank, proposals, contrib, why, extra)
    metrics = _metrics(summary, informative, random != bare, bank, next_bank, proposals, decisions, additivity)
    log.info(
        "gate round %d -> %d: %s",
        bank.round,
        next_bank.round,
        ", ".join(f"{d.column}={d.action}" for d in decisions),
    )
    return GateResult(
        next_bank, columns, contrib, additivity, decisions, masks, bare, random, full, metrics
    )


def _metrics(summary: dict[str, float | None], informative: bool, discordant: np.ndarray, bank: SkillBank,
             next_bank: SkillBank, proposals: Sequence[Proposal], decisions: Sequence[ColumnDecision],
             additivity: stats.Additivity | None) -> dict[str, float]:
    """The round's `gate/` scalars: the summary, the evidence, the bank's change, additivity."""
    metrics = {f"gate/{k}": v for k, v in summary.items() if v is not None and math.isfinite(v)}
    metrics["gate/evidence"] = float(informative)
    metrics["gate/discordant"] = float(np.count_nonzero(discordant))
    metrics["gate/chunks_before"] = float(len(bank.active))
    metrics["gate/chunks_after"] = float(len(next_bank.active))
    metrics["gate/proposals"] = float(len(proposals))
    for action in ("retain", "retire", "rewrite", "add"):
        metrics[f"gate/{action}"] = float(sum(d.action == action for d in decisions))
    if additivity is not None:
        metrics["gate/additivity_predicted"] = additivity.predicted
        metrics["gate/additivity_observed"] = additivity.observed
        metrics["gate/additivity_difference"] = additivity.difference
    return metrics


def _summary(rewards: np.ndarray, success: np.ndarray, n: int, config: GateConfig) -> dict[str, float | None]:
    """The per-round report: arm means, discordance, paired gain interval and exact McNemar.

    `rewards` and `success` hold the bare arm, the random arm, then the full arm if it ran, n each.
    """
    bare, random = rewards[:n], rewards[n : 2 * n]
    ok_b, ok_r = success[:n], success[n : 2 * n]
    out: dict[str, float | None] = {
        "bare_reward": float(bare.mean()),
        "random_reward": float(random.mean()),
        "bare_success": float(ok_b.mean()),
        "random_success": float(ok_r.mean()),
        "gain_reward": float((random - bare).mean()),
        "discordance": float((ok_b != ok_r).mean()),
    }
    mc = stats.mcnemar_exact(ok_r, ok_b)
    out["mcnemar_p"] = mc.p
    if config.bootstrap_resamples > 0:
        diff = stats.paired_bootstrap(
            random, bare, n_resamples=config.bootstrap_resamples, seed=config.seed
        )
        out["gain_reward_ci_low"], out["gain_reward_ci_high"] = diff.ci_low, diff.ci_high
    if rewards.size > 2 * n:
        out["full_reward"], out["full_success"] = float(rewards[2 * n :].mean()), float(success[2 * n :].mean())
    return out
