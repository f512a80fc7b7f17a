"""The report's front-page and protocol figures, from a bundle's primary records.

    headline    which paired comparisons the front page leads with (training's effect without the
                skill, what the final skill adds to the trained policy), the key counts
    protocol    splits, schedule, decoding, training denominators, stage wall times (config.json
                and provenance.json)
    controls    which of the study's missing controls this run is, and which it leaves open
    traces      the counts of each recorded trace (tokens per turn, reward parts)

Pure functions of JSON records; `bundle.compute_figures` stores their results in figures.json, so
`check_bundle` recomputes and compares them like every other figure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# The comparisons the front page reads (a, b): a - b on the same tasks.
HEADLINE_PAIRS = {
    "training": ("trained_bare", "base_bare"),  # the headline: the policy learned, skill removed
    "final_skill": ("trained_skill", "trained_bare"),  # what the final skill adds on top
    "whole": ("trained_skill", "base_bare"),
}
# The controls a co-evolution run is compared with (presets.py), and repeated seeds.
CONTROLS = ("plain_grpo", "fixed_skill", "no_mask", "seeds")
REWARD_PARTS = ("r_type", "r_att", "r_option", "r_price", "loose", "strict", "success")


def _section(config: Mapping[str, Any], *path: str) -> Mapping[str, Any]:
    node: Any = config
    for key in path:
        node = (node or {}).get(key) if isinstance(node, Mapping) else None
    return node if isinstance(node, Mapping) else {}


def headline(comparisons: Sequence[Mapping[str, Any]]) -> dict[str, int | None]:
    """name -> index into figures' comparisons (None when the pair was not evaluated)."""
    index = {(c["a"], c["b"]): i for i, c in enumerate(comparisons)}
    return {name: index.get(pair) for name, pair in HEADLINE_PAIRS.items()}


def key_counts(skills: Sequence[Mapping[str, Any]], provenance: Mapping[str, Any]) -> dict[str, Any]:
    """Policy parameters, and active chunks in the first and the last recorded bank."""
    def active(s: Mapping[str, Any]) -> int:
        return sum(c.get("status") == "active" for c in s.get("chunks", ()))

    model = provenance.get("model") or {}
    return {
        "training_runs": 1,  # a bundle holds one run; `intraskill multiseed` writes one per seed
        "parameters": model.get("parameters"),
        "initial_chunks": active(skills[0]) if skills else None,
        "final_chunks": active(skills[-1]) if skills else None,
    }


def preset(config: Mapping[str, Any]) -> str:
    """Which preset of presets.py the run's config is: coevolve, plain_grpo, fixed_skill, no_mask,
    or custom (masks changed some other way)."""
    skills = _section(config, "skills")
    masks = _section(config, "skills", "masks")
    mode = skills.get("mode", "coevolve")
    if mode == "none":
        return "plain_grpo"
    pinned = masks.get("skill_free") == 0.0 and all(masks.get(k) == 1.0 for k in ("prior", "floor", "ceiling"))
    if mode == "fixed":
        return "fixed_skill" if pinned or not masks else "custom"
    if pinned:
        return "no_mask"
    return "coevolve"


def controls(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """For each control: whether this run is it. A bundle is one run, so every other one is open
    until its preset has run (its own bundle)."""
    this = preset(config)
    return [{"id": c, "this_run": c == this} for c in CONTROLS]


def protocol(config: Mapping[str, Any], provenance: Mapping[str, Any]) -> dict[str, Any]:
    """The numbers of the protocol chapter: splits, schedule, denominators, decoding, stage times."""
    train, skills, evaluation = (_section(config, k) for k in ("train", "skills", "eval"))
    sessions = provenance.get("sessions") or []
    with_splits = [s for s in sessions if s.get("splits")]
    splits = dict(with_splits[-1]["splits"]) if with_splits else None
    catalog = dict(with_splits[-1].get("catalog") or {}) if with_splits else None
    groups, size = train.get("groups_per_step"), train.get("group_size")
    rounds, every = train.get("rounds"), train.get("gate_every")
    schedule = {
        "rounds": rounds, "gate_every": every,
        "steps": rounds * every if isinstance(rounds, int) and isinstance(every, int) else None,
        "groups_per_step": groups, "group_size": size,
        "episodes_per_step": groups * size if isinstance(groups, int) and isinstance(size, int) else None,
        "validation_tasks": skills.get("validation_tasks"), "test_tasks": evaluation.get("num_tasks"),
    }
    decoding = {
        name: {k: sampling.get(k) for k in ("temperature", "top_p", "top_k", "max_new_tokens")}
        for name, sampling in (("rollout", _section(config, "rollout", "sampling")),
                               ("eval", _section(config, "eval", "sampling")))
    }
    agent, env = _section(config, "agent"), _section(config, "sim", "env")
    masks = _section(config, "skills", "masks")
    loss, optim = _section(config, "train", "loss"), _section(config, "train", "optim")
    numbers = {
        "agent": {k: agent.get(k) for k in ("max_turns", "max_context_tokens", "max_observation_chars")},
        "env": {k: env.get(k) for k in ("max_steps", "page_size", "results_top_n")},
        "masks": {k: masks.get(k) for k in ("skill_free", "prior", "floor", "ceiling")},
        "loss": {k: loss.get(k) for k in ("clip_low", "clip_high", "dual_clip", "kl_coef", "tis_cap")},
        "optim": {k: optim.get(k) for k in ("learning_rate", "warmup_steps", "grad_clip", "weight_decay")},
    }
    stages = [dict(r) for r in provenance.get("stages") or []]
    return {"splits": splits, "catalog": catalog, "schedule": schedule, "decoding": decoding, **numbers,
            "stages": stages, "stage_totals": stage_totals(stages), "sessions": len(sessions)}


def stage_totals(stages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per stage name, in the order first seen: times it ran and total seconds."""
    totals: dict[str, dict[str, Any]] = {}
    for r in stages:
        t = totals.setdefault(str(r["stage"]), {"stage": str(r["stage"]), "count": 0, "seconds": 0.0})
        t["count"] += 1
        t["seconds"] += float(r.get("seconds") or 0.0)
    out = list(totals.values())
    if out:
        out.append({"stage": "total", "count": sum(t["count"] for t in out),
                    "seconds": sum(t["seconds"] for t in out)})
    return out


def traces(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per recorded trace: its outcome, reward parts and the token count of each turn."""
    out = []
    for r in rows:
        detail = r.get("reward_detail") or {}
        out.append({
            "episode_id": r.get("episode_id"), "condition": r["condition"], "task_id": int(r["task_id"]),
            "success": bool(r["success"]), "reward": float(r["reward"]),
            "reward_detail": {k: detail.get(k) for k in REWARD_PARTS},
            "prompt_tokens": r.get("prompt_tokens"), "generated_tokens": r.get("generated_tokens"),
            "turns": [{"reply_tokens": len(t.get("reply_token_ids") or ()),
                       "observation_tokens": t.get("observation_tokens")} for t in r["transcript"]],
        })
    return out
