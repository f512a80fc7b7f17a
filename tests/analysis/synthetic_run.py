"""A plausible run directory without a model: what the trainer and evaluation would write.

Rounds of training steps (metrics rows in two scopes, rollout files with groups, retries of
all-wrong groups), a gate closing each round (a real OLS fit of known chunk effects on paired
bare/random validation episodes, rule-based decisions, the next bank with its ledger), and the
test outcomes of the four conditions on shared tasks with known success rates.

The run trains on the loose reward, as the quickstart does: every episode's `reward` is its loose
reward, above the strict one on each failure, so a table that reads one for the other is caught.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from intraskill_jax import rundir, stats
from intraskill_jax.skills.bank import Chunk, LedgerEntry, SkillBank

S0 = Path(__file__).resolve().parents[2] / "skills" / "s0"
EVAL_SUCCESS = {"base_bare": 0.30, "base_skill": 0.40, "trained_bare": 0.50, "trained_skill": 0.65}


@dataclasses.dataclass(frozen=True)
class RunSpec:
    rounds: int = 2
    steps_per_round: int = 5
    groups_per_step: int = 3
    group_size: int = 4
    n_val: int = 48
    n_eval: int = 40
    with_eval: bool = True
    extra_steps: int = 0  # steps after the last gate: a run stopped mid-round
    seed: int = 0


def make_run(root: Path, spec: RunSpec = RunSpec()) -> Path:
    rng = np.random.default_rng(spec.seed)
    root.mkdir(parents=True, exist_ok=True)
    rundir.write_json(root / "config.json", {"name": "synthetic", "gate_every": spec.steps_per_round,
                                             "group_size": spec.group_size, "seed": spec.seed,
                                             "sim": {"env": {"reward": "loose"}}})
    bank = SkillBank.load(S0)
    bank.save_round(root)
    metrics: list[dict[str, Any]] = []
    step = 0
    for r in range(spec.rounds):
        for _ in range(spec.steps_per_round):
            step += 1
            _train_step(root, rng, spec, bank, r, step, metrics)
        bank = _gate(root, rng, spec, bank, step, metrics)
    for _ in range(spec.extra_steps):
        step += 1
        _train_step(root, rng, spec, bank, spec.rounds, step, metrics)
    rundir.write_jsonl(root / "metrics.jsonl", metrics)
    if spec.with_eval:
        _evaluate(root, rng, spec, bank.name)
    return root


def episode(rng: np.random.Generator, eid: str, task: int, group: int, mask: list[int],
            p_success: float, success: bool | None = None) -> dict[str, Any]:
    ok = bool(rng.random() < p_success) if success is None else success
    strict = 1.0 if ok else float(rng.choice([0.0, 0.25, 0.5, 0.75]))
    loose = 1.0 if ok else 0.5 + strict / 2  # partial credit: the reward the run trains on
    turns = int(rng.integers(3, 12))
    tokens = turns * int(rng.integers(20, 60))
    return {
        "episode_id": eid, "task_id": task, "group": group, "skill_mask": mask,
        "reward": loose, "success": ok,
        "reward_detail": {"r_type": 1.0, "r_att": strict, "r_option": 1.0 if ok else 0.5,
                          "r_price": 1.0, "loose": loose, "strict": strict,
                          "success": float(ok), "correct_product": float(ok)},
        "turns": turns, "generated_tokens": tokens, "tokens_per_turn": tokens / turns,
        "searches": int(rng.integers(1, 4)) + (0 if ok else 1),
        "product_visits": int(rng.integers(0, 5)), "repairs": int(rng.integers(0, 3)),
        "truncated": None if ok or rng.random() < 0.7 else "max_turns",
    }


def _train_step(root: Path, rng: np.random.Generator, spec: RunSpec, bank: SkillBank, round_: int,
                step: int, metrics: list[dict[str, Any]]) -> None:
    k = len(bank.active)
    rows: list[dict[str, Any]] = []
    p = 0.3 + 0.05 * step / spec.steps_per_round
    wrong_groups = []
    for g in range(spec.groups_per_step):
        task = int(rng.integers(0, 500))
        mask = [0] * k if rng.random() < 0.2 else [int(v) for v in rng.random(k) < 0.5]
        sibs = [episode(rng, f"s{step}-g{g}-{i}", task, g, mask, p) for i in range(spec.group_size)]
        if not any(e["success"] for e in sibs):
            wrong_groups.append((task, g))
        rows += [{**e, "retry": False} for e in sibs]
    for j, (task, _) in enumerate(wrong_groups):
        g = spec.groups_per_step + j
        rows += [{**episode(rng, f"s{step}r-g{g}-{i}", task, g, [1] * k, p + 0.2), "retry": True}
                 for i in range(spec.group_size)]
    rewards = np.array([e["reward"] for e in rows]).reshape(-1, spec.group_size)
    std = rewards.std(axis=1, keepdims=True)
    adv = np.where(std > 0, (rewards - rewards.mean(axis=1, keepdims=True)) / np.maximum(std, 1e-6), 0.0)
    # As the trainer does: episode files are numbered by the step counter before the update
    # (from 0), metric rows by the count of finished steps (from 1).
    for i, e in enumerate(rows):
        e.update(step=step - 1, round=round_, admitted=bool(std[i // spec.group_size, 0] > 0),
                 advantage=float(adv.flat[i]))
    rundir.write_jsonl(rundir.rollouts_path(root, step - 1), rows)
    metrics.append({"step": step, "rollout/reward_mean": float(rewards.mean()),
                    "rollout/success": float(np.mean([e["success"] for e in rows])),
                    "rollout/episodes_generated": float(len(rows)),
                    "rollout/episodes_admitted": float(sum(e["admitted"] for e in rows)),
                    "rollout/zero_variance_drop_rate": float(np.mean(std == 0)),
                    "perf/rollout_seconds": float(rng.uniform(1, 2))})
    metrics.append({"step": step, "train/pg_loss": float(rng.normal(0, 0.1)),
                    "train/ppo_kl": float(abs(rng.normal(0, 0.01))), "train/updated": 1.0,
                    "skills/retry_groups": float(len(wrong_groups))})


def _gate(root: Path, rng: np.random.Generator, spec: RunSpec, bank: SkillBank, step: int,
          metrics: list[dict[str, Any]]) -> SkillBank:
    """Round K's gate: known effects, a real fit, the positive-beta rule, round K+1's bank."""
    active = list(bank.active)
    if bank.round == 0:
        proposals = [{"id": "compare-reviews", "op": "add", "target": None,
                      "en": "Compare the reviews of the two closest matches before choosing.",
                      "zh": "在选择之前，比较两个最接近商品的评价。", "title": "Compare reviews"}]
    else:
        target = active[0]
        proposals = [{"id": f"{target.id}-r{bank.round}", "op": "rewrite", "target": target.id,
                      "en": target.en + " Put the brand first.", "zh": target.zh + " 把品牌放在最前面。",
                      "title": target.title}]
    columns = [c.id for c in active] + [p["id"] for p in proposals]
    kinds = ["chunk"] * len(active) + ["proposal"] * len(proposals)
    effects = np.array([0.15 if i % 4 else -0.25 for i in range(len(active))] + [0.4])
    n, k = spec.n_val, len(columns)
    masks = (rng.random((n, k)) < 0.5).astype(int)
    bare = rng.choice([0.0, 0.25, 0.5, 1.0], size=n)
    random_arm = np.clip(bare + masks @ effects / 2 + rng.normal(0, 0.1, n), 0, 1)
    full = np.clip(bare + effects.sum() / 4 + rng.normal(0, 0.1, n), 0, 1)
    fit = stats.chunk_contributions(random_arm - bare, masks, names=columns)
    add = stats.additivity_check(fit, full - bare)
    decisions, entries, chunks = [], [], []
    for j, c in enumerate(active):
        keep = fit.beta[j] > 0
        action = "retain" if keep else "retire"
        decisions.append({"column": c.id, "kind": "chunk", "passes": bool(keep), "action": action,
                          "reason": f"beta {fit.beta[j]:+.3f}", "estimate": fit.row(j)})
    chunks = [c if c.status != "active" or fit.beta[columns.index(c.id)] > 0 else
              dataclasses.replace(c, status="retired") for c in bank.chunks]
    for j, c in enumerate(active):
        entries.append(LedgerEntry(c.id, decisions[j]["action"], decisions[j]["reason"], fit.row(j)))
    for i, prop in enumerate(proposals):
        j = len(active) + i
        ok = bool(fit.beta[j] > 0)
        if prop["op"] == "add":
            action = "add" if ok else "reject"
            if ok:
                chunks.append(Chunk(prop["id"], prop["en"], prop["zh"], title=prop["title"]))
                entries.append(LedgerEntry(prop["id"], "add", "positive", fit.row(j), proposal_id=prop["id"]))
        else:
            tj = columns.index(prop["target"])
            action = "rewrite" if ok and fit.beta[j] > fit.beta[tj] else "reject"
            if action == "rewrite":
                old = bank.chunk(prop["target"])
                chunks = [dataclasses.replace(c, en=prop["en"], zh=prop["zh"], revision=c.revision + 1,
                                              status="active") if c.id == old.id else c for c in chunks]
                entries = [e for e in entries if e.chunk_id != old.id]
                entries.append(LedgerEntry(old.id, "rewrite", "beats its target", fit.row(j),
                                           proposal_id=prop["id"], previous_text={"en": old.en, "zh": old.zh}))
                decisions[tj] = {**decisions[tj], "action": "rewrite"}
        decisions.append({"column": prop["id"], "kind": "proposal", "passes": ok, "action": action,
                          "reason": f"beta {fit.beta[j]:+.3f}", "estimate": fit.row(j)})
    ok_b, ok_r = bare >= 1, random_arm >= 1
    mc = stats.mcnemar_exact(ok_r, ok_b)
    gain = stats.paired_bootstrap(random_arm, bare, n_resamples=500)
    accepted = sum(d["kind"] == "proposal" and d["action"] in ("add", "rewrite") for d in decisions)
    doc = {
        "round": bank.round, "step": step, "columns": columns, "kinds": kinds, "n": n,
        "beta": fit.beta.tolist(), "se": fit.se.tolist(), "ci_low": fit.ci_low.tolist(),
        "ci_high": fit.ci_high.tolist(), "p": fit.p.tolist(), "decisions": decisions,
        "summary": {"bare_reward": float(bare.mean()), "random_reward": float(random_arm.mean()),
                    "full_reward": float(full.mean()), "bare_success": float(ok_b.mean()),
                    "random_success": float(ok_r.mean()), "full_success": float((full >= 1).mean()),
                    "gain_reward": float((random_arm - bare).mean()),
                    "gain_reward_ci_low": gain.ci_low, "gain_reward_ci_high": gain.ci_high,
                    "discordance": float((ok_b != ok_r).mean()), "mcnemar_p": mc.p, "evidence": 1.0},
        "additivity": dataclasses.asdict(add),
        "funnel": {"failures": 30 - 5 * bank.round, "recovered_by_retry": 8, "analysed": 22 - 5 * bank.round,
                   "proposals": len(proposals), "rejected": len(proposals) - accepted, "accepted": accepted},
    }
    rundir.write_json(rundir.gate_path(root, bank.round), doc)
    eps = []
    for i in range(n):
        for arm, mask, value in (("bare", [0] * k, bare[i]), ("random", masks[i].tolist(), random_arm[i]),
                                 ("full", [1] * k, full[i])):
            e = episode(rng, f"g{bank.round}-{arm}-{i}", 1000 + i, 0, mask, 0.0, success=bool(value >= 1))
            e.update(reward=float(value), arm=arm, round=bank.round, step=step)
            # The gate fits the run's (loose) reward; strict gives credit only for a success.
            e["reward_detail"].update(loose=float(value), strict=float(value) if value >= 1 else 0.0)
            eps.append(e)
    rundir.write_jsonl(rundir.gate_episodes_path(root, bank.round), eps)
    metrics.append({"step": step, **{f"gate/{k_}": v for k_, v in doc["summary"].items()}})
    deltas = int(np.count_nonzero(random_arm != bare))
    evidence = {"informative": True, "reason": f"{deltas} of {n} tasks have a non-zero paired delta"}
    nxt = bank.next_version(chunks, entries, {"fit": {"n": n}, "evidence": evidence})
    nxt.save_round(root)
    return nxt


def _evaluate(root: Path, rng: np.random.Generator, spec: RunSpec, final_skill: str) -> None:
    difficulty = rng.random(spec.n_eval)  # shared across conditions: outcomes are paired
    rows = []
    for cond, p in EVAL_SUCCESS.items():
        policy, skill = cond.split("_")
        skill_name = "none" if skill == "bare" else ("s0" if policy == "base" else final_skill)
        for t in range(spec.n_eval):
            ok = bool(difficulty[t] + rng.normal(0, 0.15) < p)
            e = episode(rng, f"{cond}-{t}", 2000 + t, 0, [], 0.0, success=ok)
            rows.append({**e, "condition": cond, "policy": policy, "skill": skill_name})
    rundir.write_jsonl(rundir.eval_outcomes_path(root), rows)
