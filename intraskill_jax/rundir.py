"""The run directory: where each record of a run lives, and the per-episode record format.

Everything the report, the bundle and a resumed run read is written through these paths:

    <workdir>/config.json                       the resolved run config
    <workdir>/metrics.jsonl                     one JSON object per (step, scope) write (metrics.py)
    <workdir>/tb/                               TensorBoard events
    <workdir>/checkpoints/                      orbax (params, optimizer, step, RNG, cursor, bank round)
    <workdir>/hf/weight_vNNNNNN/                HF safetensors pushed to SGLang
    <workdir>/skills/round_K/                   the bank of round K and its ledger (skills/bank.py)
    <workdir>/rollouts/step_NNNNNN.jsonl        training episodes of a step (episode_trace + step fields)
    <workdir>/gates/round_K.json                the gate that closed round K (fit, decisions, funnel)
    <workdir>/gates/round_K_episodes.jsonl      its validation episodes (episode_record + arm, mask)
    <workdir>/eval/outcomes.jsonl               test episodes, one per (condition, task)
    <workdir>/bundle/                           the shareable copy with its SHA-256 manifest

Record files are written whole to a temporary name and renamed, so a killed run leaves either the
complete file or none.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from intraskill_jax.agent.trajectory import Trajectory, Turn

def hf_weights_dir(workdir: str | os.PathLike, version: int) -> Path:
    """The HF directory (safetensors, config, tokenizer) of weight version `version` that a
    rollout server loads (`update_weights_from_disk`)."""
    return Path(workdir) / "hf" / f"weight_v{version:06d}"


def rollouts_path(workdir: str | os.PathLike, step: int) -> Path:
    return Path(workdir) / "rollouts" / f"step_{step:06d}.jsonl"


def gate_path(workdir: str | os.PathLike, round_: int) -> Path:
    return Path(workdir) / "gates" / f"round_{round_}.json"


def gate_episodes_path(workdir: str | os.PathLike, round_: int) -> Path:
    return Path(workdir) / "gates" / f"round_{round_}_episodes.jsonl"


def eval_outcomes_path(workdir: str | os.PathLike) -> Path:
    return Path(workdir) / "eval" / "outcomes.jsonl"


def episode_record(t: Trajectory) -> dict[str, Any]:
    """The behaviour and outcome of one episode, without its tokens.

    `product_visits` counts arrivals on a product page (option clicks on the same page are not
    visits; the environment counts them that way); `turns` are model replies.
    """
    turns = len(t.turns)
    return {
        "episode_id": t.episode_id,
        "task_id": int(t.task_id),
        "group": int(t.group),
        "skill_mask": [int(v) for v in t.skill_mask],
        "reward": float(t.reward),
        "success": bool(t.success),
        "reward_detail": {k: float(v) for k, v in t.reward_detail.items()},
        "turns": turns,
        "generated_tokens": int(t.generated_tokens),
        "tokens_per_turn": float(t.generated_tokens / turns) if turns else 0.0,
        "searches": int(t.env_stats.get("searches", 0)),
        "product_visits": int(t.env_stats.get("product_visits", 0)),
        "repairs": int(t.repairs),
        "truncated": t.truncated,
    }


def episode_trace(t: Trajectory) -> dict[str, Any]:
    """`episode_record` plus what the analysts read (env stats and each turn), still no tokens."""
    return {**episode_record(t), "env_stats": dict(t.env_stats),
            "trace": [dataclasses.asdict(turn) for turn in t.turns]}


def trajectory_from_trace(row: Mapping[str, Any]) -> Trajectory:
    """A token-less `Trajectory` back from `episode_trace` (enough for the analysts)."""
    return Trajectory(
        episode_id=row["episode_id"], task_id=int(row["task_id"]), group=int(row["group"]),
        skill_mask=tuple(row["skill_mask"]), token_ids=[], loss_mask=[], logprobs=[], prompt_length=0,
        turns=[Turn(**turn) for turn in row.get("trace", ())], reward=float(row["reward"]),
        reward_detail=dict(row["reward_detail"]), env_stats=dict(row.get("env_stats", {})),
        done=True, truncated=row.get("truncated"),
    )


def json_finite(x: Any) -> Any:
    """JSON has no NaN or infinity: an undefined statistic (the p-value of a zero-variance fit, say)
    is stored as null. Recurses through mappings and sequences; numpy scalars become Python ones."""
    if isinstance(x, np.generic):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, Mapping):
        return {k: json_finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_finite(v) for v in x]
    return x


def write_json(path: str | os.PathLike, doc: Any) -> Path:
    """Atomically writes one JSON document."""
    return _atomic_write(Path(path), json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def write_jsonl(path: str | os.PathLike, rows: Iterable[Mapping[str, Any]]) -> Path:
    """Atomically writes JSON lines (the whole file at once)."""
    return _atomic_write(Path(path), "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows))


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    path = Path(path)
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {i + 1} is not JSON ({e.msg})") from None
    return rows


def _atomic_write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def publish_dir(out: str | os.PathLike, write: Callable[[Path], Any]) -> Path:
    """Writes a directory (`write(tmp)`) under a temporary name and renames it into place: readers
    see all of it or nothing (an HF export, say). Returns `out`."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    for stale in (tmp, out):
        if stale.exists():
            shutil.rmtree(stale)
    write(tmp)
    tmp.replace(out)
    return out
