"""Trace2Skill analysts: trajectories in, validated bank proposals out.

Pipeline (`propose`):

1. Every failed trajectory, plus a seeded sample of successes, goes to one analyst, all in
   parallel (threads: analysts are I/O bound or cheap). Each analyst sees the same frozen bank and
   never another analyst's output, and returns an `AnalystReport`: lessons and patches (add a
   chunk, or rewrite one), each patch naming the trajectories that support it.
2. Consolidation clusters patches (same op and target, and the same failure class or similar
   text), ranks clusters by support (distinct trajectories), and keeps at most `max_proposals`
   that pass the validators. Recurrence stands in for evidence here; the gate then measures.
3. Deterministic validators reject a proposal that is too long, lacks either language, duplicates
   an active chunk (rapidfuzz ratio), rewrites a chunk that is not active or changes nothing, or
   carries chat/tool markup (`CONTROL_MARKUP`: it would let a proposal forge turns in the policy's
   context). Every rejection is counted by reason.

Backends: `OfflineAnalyst` (the default; a failure taxonomy, no LLM) here, and an
OpenAI-compatible chat backend in `analyst_openai.py`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import numpy as np
from rapidfuzz import fuzz

from intraskill_jax.agent.trajectory import Trajectory
from intraskill_jax.skills.bank import Proposal, SkillBank
from intraskill_jax.tokenization import CONTROL_MARKUP

if TYPE_CHECKING:  # runconfig imports this module's AnalystsConfig
    from intraskill_jax.runconfig import SkillsConfig

log = logging.getLogger(__name__)

FAILURE_CLASSES = (
    "never_searched",
    "step_limit",
    "malformed_calls",
    "invalid_actions",
    "bought_without_asking",
    "wrong_category",
    "missing_attribute",
    "wrong_option",
    "over_budget",
)
_CJK = re.compile(r"[\u4e00-\u9fff]")


@dataclasses.dataclass(frozen=True)
class Lesson:
    """A memory item: what happened and what generalises (never the ground truth)."""

    title: str
    detail: str
    failure_class: str | None = None


@dataclasses.dataclass(frozen=True)
class Patch:
    """One analyst's proposed edit. `key` groups patches of the same kind (a failure class)."""

    op: Literal["add", "rewrite"]
    en: str
    zh: str
    title: str
    rationale: str
    trajectory_ids: tuple[str, ...]
    target: str | None = None
    key: str | None = None


@dataclasses.dataclass(frozen=True)
class AnalystReport:
    trajectory_id: str
    success: bool
    lessons: tuple[Lesson, ...] = ()
    patches: tuple[Patch, ...] = ()
    source: str = ""
    error: str | None = None  # a reason code when the analyst produced nothing usable


class Analyst(Protocol):
    name: str

    def analyse(self, trajectory: Trajectory, bank: SkillBank, lang: str) -> AnalystReport: ...


# -- the offline analyst: a failure taxonomy ---------------------------------------------------


def purchased(t: Trajectory) -> bool:
    """The episode ended with a purchase (not cut by a step, turn or context limit)."""
    return t.truncated is None and not t.env_stats.get("truncated", False)


def failure_classes(t: Trajectory) -> tuple[str, ...]:
    """Every taxonomy class a trajectory shows, in `FAILURE_CLASSES` order."""
    r, s = t.reward_detail, t.env_stats
    bought = purchased(t)
    found = {
        "never_searched": s.get("searches", 0) == 0,
        "step_limit": not bought,
        "malformed_calls": t.repairs > 0,
        "invalid_actions": s.get("invalid_actions", 0) > 0,
        "bought_without_asking": bool(s.get("unconfirmed_purchase"))
        or s.get("refused_purchases", 0) > 0,
        "wrong_category": bought and r.get("r_type", 0.0) < 1.0,
        "missing_attribute": bought and r.get("r_att", 0.0) < 1.0,
        "wrong_option": bought and r.get("r_option", 0.0) < 1.0,
        "over_budget": bought and r.get("r_price", 0.0) == 0.0,
    }
    return tuple(c for c in FAILURE_CLASSES if found[c])


# class -> (chunk it sharpens, title, en sentence, zh sentence). The sentence is appended to the
# chunk as a rewrite when that chunk is active, and stands alone as an addition when it is not.
_FIXES: dict[str, tuple[str, str, str, str]] = {
    "never_searched": (
        "query-specific",
        "Search early",
        "Call search early in every episode (after any questions to the shopper): an episode that never searches cannot find the product.",
        "每个回合都要尽早调用 search（先问完顾客的问题）：从不搜索就不可能找到商品。",
    ),
    "step_limit": (
        "when-to-buy",
        "Finish before the step limit",
        "Do not loop between pages or repeat searches: the episode ends with nothing bought when the step limit is reached, which always scores zero.",
        "不要在页面之间来回跳或重复搜索：达到步数上限时回合结束且什么都没买，得分一定为零。",
    ),
    "malformed_calls": (
        "recover-invalid-action",
        "Well-formed tool calls",
        "Every reply must be exactly one well-formed tool call (search, click or ask_shopper) with its one argument, and nothing that is not part of the call.",
        "每次回复必须恰好是一个格式正确的工具调用（search、click 或 ask_shopper），带上唯一的参数，不要夹带调用以外的内容。",
    ),
    "invalid_actions": (
        "recover-invalid-action",
        "Click only listed buttons",
        "Before clicking, find the value in the page's list of clickable buttons and copy it exactly; product ids and option values that are not listed are rejected.",
        "点击前先在页面的可点击按钮列表中找到该值并原样复制；列表中没有的商品编号和规格值都会被拒绝。",
    ),
    "bought_without_asking": (
        "ask-before-buying",
        "Ask before buying",
        "Never click buy now before asking the shopper about the product type, the requirements, the budget and every option, and confirming the choice.",
        "在问清顾客的商品类型、要求、预算和每个规格并确认选择之前，绝不要点击 buy now。",
    ),
    "wrong_category": (
        "query-specific",
        "Check the product type",
        "Before opening or buying a product, check that its title names the requested product type; an item of a neighbouring type counts as a wrong purchase.",
        "打开或购买商品前，先确认标题写的是所要求的商品类型；相近类型的商品也算买错。",
    ),
    "missing_attribute": (
        "check-features",
        "Tick off every attribute",
        "Before buying, tick off every required attribute, including the one from the profile, against the title or the features page; if one is stated nowhere, pick another product.",
        "购买前，把每个要求的属性（包括档案里的那条）对照标题或 features 页逐一核对；哪一条都找不到时就换一个商品。",
    ),
    "wrong_option": (
        "confirm-options",
        "Select the requested options",
        "Select exactly the option values that were requested, one click per axis, and check that the page shows them as selected before buying; the preselected value is often wrong.",
        "只选所要求的规格值，每个维度点击一次，购买前确认页面显示已选中；默认选中的值常常不对。",
    ),
    "over_budget": (
        "check-sku-price",
        "Price check right before buying",
        "Compare the selected SKU's price with the budget right before click[buy now]; a larger size or another option often costs more and pushes the price over the budget.",
        "点击 click[buy now] 前再比较一次所选规格的价格和预算；更大的尺寸或别的选项往往更贵，会超出预算。",
    ),
}


def _evidence(t: Trajectory, cls: str) -> str:
    r, s = t.reward_detail, t.env_stats
    detail = {
        "never_searched": f"0 searches in {s.get('steps', 0)} steps",
        "step_limit": f"cut by the {t.truncated or 'env_steps'} limit after {s.get('steps', 0)} steps",
        "malformed_calls": f"{t.repairs} malformed replies",
        "invalid_actions": f"{s.get('invalid_actions', 0)} invalid actions",
        "bought_without_asking": f"{s.get('refused_purchases', 0)} refused purchases, unconfirmed={bool(s.get('unconfirmed_purchase'))}",
        "wrong_category": f"r_type={r.get('r_type', 0.0):.2f}",
        "missing_attribute": f"r_att={r.get('r_att', 0.0):.2f}",
        "wrong_option": f"r_option={r.get('r_option', 0.0):.2f}",
        "over_budget": "r_price=0",
    }[cls]
    return f"{t.episode_id} (task {t.task_id}): {detail}"


class OfflineAnalyst:
    """No LLM: classifies each failure and writes the matching fix as a patch (en and zh)."""

    name = "offline"

    def analyse(self, trajectory: Trajectory, bank: SkillBank, lang: str) -> AnalystReport:
        tid = trajectory.episode_id
        if trajectory.success:
            s = trajectory.env_stats
            path = (
                " -> ".join(t.action for t in trajectory.turns if t.action)
                or "(no actions recorded)"
            )
            lesson = Lesson(
                "Lean solution path",
                f"{s.get('searches', 0)} searches, {s.get('product_visits', 0)} "
                f"product visits, {s.get('steps', 0)} steps: {path}",
            )
            return AnalystReport(tid, True, (lesson,), (), self.name)
        lessons, patches = [], []
        active = {c.id: c for c in bank.active}
        for cls in failure_classes(trajectory):
            target, title, en, zh = _FIXES[cls]
            evidence = _evidence(trajectory, cls)
            lessons.append(Lesson(title, evidence, cls))
            if target in active:
                chunk = active[target]
                patches.append(
                    Patch(
                        "rewrite",
                        f"{chunk.en} {en}",
                        f"{chunk.zh}{zh}",
                        chunk.title,
                        evidence,
                        (tid,),
                        target=target,
                        key=cls,
                    )
                )
            else:
                patches.append(Patch("add", en, zh, title, evidence, (tid,), key=cls))
        return AnalystReport(tid, False, tuple(lessons), tuple(patches), self.name)


# -- validation and consolidation ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnalystsConfig:
    """Analyst fan-out, consolidation and validator limits.

    Attributes:
      max_proposals: at most this many proposals per round (K).
      success_sample: fraction of successful trajectories analysed as well.
      max_workers: parallel analysts.
      min_support: a cluster needs this many distinct supporting trajectories.
      max_chars_en: longest English text of a proposal (characters).
      max_chars_zh: longest Chinese text of a proposal (characters).
      duplicate_ratio: rapidfuzz ratio (0-100) at or above which a proposal duplicates a chunk.
      merge_ratio: rapidfuzz token_set_ratio at or above which two unkeyed patches are one cluster.
    """

    max_proposals: int = 3
    success_sample: float = 0.1
    max_workers: int = 8
    min_support: int = 1
    max_chars_en: int = 700
    max_chars_zh: int = 350
    duplicate_ratio: float = 85.0
    merge_ratio: float = 80.0

    def __post_init__(self) -> None:
        if self.max_proposals < 0 or self.max_workers < 1 or self.min_support < 1:
            raise ValueError("need max_proposals >= 0, max_workers >= 1 and min_support >= 1")
        if not 0.0 <= self.success_sample <= 1.0:
            raise ValueError(f"success_sample must be in [0, 1], got {self.success_sample}")


def validate(
    proposal: Proposal, bank: SkillBank, config: AnalystsConfig = AnalystsConfig()
) -> list[str]:
    """Reasons (code: detail) to reject a proposal; empty when it is acceptable."""
    reasons = []
    for field in ("en", "zh", "title"):
        if CONTROL_MARKUP.search(getattr(proposal, field)):
            reasons.append(f"control_markup: {field} contains chat/tool markup")
    if not proposal.en.strip() or not proposal.zh.strip():
        reasons.append("empty: both en and zh text are required")
    if len(proposal.en) > config.max_chars_en:
        reasons.append(f"too_long: en has {len(proposal.en)} chars > {config.max_chars_en}")
    if len(proposal.zh) > config.max_chars_zh:
        reasons.append(f"too_long: zh has {len(proposal.zh)} chars > {config.max_chars_zh}")
    if proposal.zh.strip() and not _CJK.search(proposal.zh):
        reasons.append("wrong_language: zh text has no Chinese characters")
    if any(c.id == proposal.id for c in bank.chunks):
        reasons.append(f"id_taken: {proposal.id} is already a chunk id")
    active = {c.id: c for c in bank.active}
    if proposal.op == "rewrite":
        target = active.get(proposal.target or "")
        if target is None:
            reasons.append(f"unknown_target: {proposal.target!r} is not an active chunk")
        elif (
            fuzz.ratio(proposal.en, target.en) >= 99.0
            and fuzz.ratio(proposal.zh, target.zh) >= 99.0
        ):
            reasons.append(f"no_change: the rewrite repeats {target.id}")
    for c in active.values():
        if c.id == proposal.target:
            continue
        ratio = max(fuzz.ratio(proposal.en, c.en), fuzz.ratio(proposal.zh, c.zh))
        if ratio >= config.duplicate_ratio:
            reasons.append(f"duplicate: {ratio:.0f}% like chunk {c.id}")
    return reasons


@dataclasses.dataclass
class _Cluster:
    op: str
    target: str | None
    key: str | None
    patches: list[Patch]

    @property
    def support(self) -> set[str]:
        return {i for p in self.patches for i in p.trajectory_ids}


def consolidate(
    patches: Sequence[Patch], config: AnalystsConfig = AnalystsConfig()
) -> list[_Cluster]:
    """Clusters patches and returns them by support (most first; ties keep first-seen order)."""
    clusters: list[_Cluster] = []
    for p in patches:
        for c in clusters:
            if c.op != p.op or c.target != p.target:
                continue
            if (p.key is not None and c.key == p.key) or (
                p.key is None
                and c.key is None
                and fuzz.token_set_ratio(p.en, c.patches[0].en) >= config.merge_ratio
            ):
                c.patches.append(p)
                break
        else:
            clusters.append(_Cluster(p.op, p.target, p.key, [p]))
    return sorted(clusters, key=lambda c: -len(c.support))


def _representative(c: _Cluster) -> Patch:
    """The most frequent text of a cluster (first seen among ties)."""
    counts = collections.Counter((p.en, p.zh) for p in c.patches)
    best = max(counts.values())
    return next(p for p in c.patches if counts[(p.en, p.zh)] == best)


def _slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return "-".join(s.split("-")[:5]) or "chunk"


@dataclasses.dataclass
class ProposalBatch:
    proposals: list[Proposal]
    rejected: list[tuple[Proposal, list[str]]]
    reports: list[AnalystReport]
    counters: dict[str, float]


def propose(
    trajectories: Sequence[Trajectory],
    bank: SkillBank,
    analyst: Analyst,
    rng: np.random.Generator,
    *,
    config: AnalystsConfig = AnalystsConfig(),
    lang: str = "en",
) -> ProposalBatch:
    """Analyses failures and sampled successes in parallel and returns validated proposals."""
    failures = [t for t in trajectories if not t.success]
    successes = [t for t in trajectories if t.success]
    n_succ = round(config.success_sample * len(successes))
    sampled = (
        [successes[i] for i in sorted(rng.choice(len(successes), n_succ, replace=False))]
        if n_succ
        else []
    )
    counters: collections.Counter[str] = collections.Counter()
    counters.update(
        {"skills/analyst_failures": len(failures), "skills/analyst_successes": len(sampled)}
    )

    def run(t: Trajectory) -> AnalystReport:
        try:
            return analyst.analyse(t, bank, lang)
        except Exception as e:  # one bad analysis must not end the round; it is counted instead
            log.exception("analyst %s failed on %s", analyst.name, t.episode_id)
            return AnalystReport(
                t.episode_id,
                t.success,
                source=analyst.name,
                error=f"analyst_exception: {type(e).__name__}",
            )

    with concurrent.futures.ThreadPoolExecutor(max_workers=config.max_workers) as pool:
        reports = list(pool.map(run, failures + sampled))
    for r in reports:
        if r.error is not None:
            counters[f"skills/analyst_errors/{r.error.split(':', 1)[0]}"] += 1
    patches = [p for r in reports for p in r.patches]
    counters["skills/analyst_patches"] = len(patches)
    clusters = consolidate(patches, config)
    counters["skills/analyst_clusters"] = len(clusters)

    proposals: list[Proposal] = []
    rejected: list[tuple[Proposal, list[str]]] = []
    used = {c.id for c in bank.chunks}
    for c in clusters:
        if len(proposals) >= config.max_proposals:
            break
        rep = _representative(c)
        support = tuple(sorted(c.support))
        base = f"r{bank.round + 1}-{_slug(c.key or rep.title or rep.en)}"
        if c.target is not None:
            base = f"r{bank.round + 1}-{c.target}"[:56]
        pid, n = base[:60].strip("-"), 2
        while pid in used:
            pid, n = f"{base[:57].strip('-')}-{n}", n + 1
        prop = Proposal(
            pid,
            rep.op,
            rep.en,
            rep.zh,
            rep.title,
            c.target,
            support,
            analyst.name,
            f"{len(support)} trajectories; e.g. {rep.rationale}",
        )
        reasons = validate(prop, bank, config)
        if len(support) < config.min_support:
            reasons.append(f"low_support: {len(support)} < {config.min_support}")
        if reasons:
            rejected.append((prop, reasons))
            for r in reasons:
                counters[f"skills/proposals_rejected/{r.split(':', 1)[0]}"] += 1
            continue
        used.add(pid)
        proposals.append(prop)
    counters["skills/proposals"] = len(proposals)
    return ProposalBatch(proposals, rejected, reports, {k: float(v) for k, v in counters.items()})


def _openai(config: SkillsConfig) -> Analyst:
    from intraskill_jax.skills.analyst_openai import OpenAIAnalyst

    return OpenAIAnalyst(config.analyst_url, config.analyst_model)


# `skills.analyst` -> a builder of that analyst from the skills config: a new analyst is one module
# implementing `Analyst` plus one entry here (and its name among `SkillsConfig.analyst`'s values).
ANALYSTS: dict[str, Callable[[SkillsConfig], Analyst]] = {
    "offline": lambda config: OfflineAnalyst(),  # failure taxonomy over the traces, no LLM
    "openai": _openai,  # an OpenAI-compatible chat endpoint at `skills.analyst_url`
}


def make_analyst(config: SkillsConfig) -> Analyst:
    """The analyst `skills.analyst` names."""
    return ANALYSTS[config.analyst](config)
