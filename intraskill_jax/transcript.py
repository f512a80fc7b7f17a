"""Whole episodes as text: what the policy read and wrote, turn by turn, for the report.

    rows = [episode_transcript(t, tokenizer, world.catalog.tasks[t.task_id]) for t in examples(trajs)]

An episode's records elsewhere (`rundir.episode_trace`) keep its behaviour and outcome without
text. A transcript is decoded from the episode's own token ids, so it shows exactly what the model
saw (chat markup included): the prompt (system prompt, skill text, the first observation), then per
turn the reply with its token ids and pieces, the action it became, and the observation tokens
appended after it. The reward arrives once, when the episode ends. `evaluate` writes a few per
condition to `eval/traces.jsonl`; the bundle carries them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from intraskill_jax import rundir
from intraskill_jax.agent.trajectory import Trajectory


def examples(trajs: Sequence[Trajectory]) -> list[Trajectory]:
    """The first success and the first failure (in task order), whichever exist."""
    picked = []
    for wanted in (True, False):
        first = next((t for t in trajs if bool(t.success) == wanted), None)
        if first is not None:
            picked.append(first)
    return picked


def _decode(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def task_goal(task: Any) -> dict[str, Any]:
    """A task's goal as JSON: the instruction and what the reward checks (sim.records.Task)."""
    goal = {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    return rundir.json_finite({k: dict(v) if isinstance(v, Mapping) else list(v) if isinstance(v, tuple) else v
                               for k, v in goal.items()})


def episode_transcript(t: Trajectory, tokenizer: Any, task: Any = None) -> dict[str, Any]:
    """`rundir.episode_record` plus the prompt and each turn's reply and observation as text.

    A turn's reply is its run of sampled tokens; its observation is the run of appended tokens
    after it (none after the last turn of an episode that ended, or was cut for context length).
    """
    ids, mask = t.token_ids, t.loss_mask
    pos = t.prompt_length
    turns = []
    for turn in t.turns:
        reply = ids[pos : pos + turn.generated_tokens]
        pos += len(reply)
        end = pos
        while end < len(ids) and mask[end] == 0:
            end += 1
        observation = ids[pos:end]
        pos = end
        turns.append({
            "reply": _decode(tokenizer, reply),
            "reply_token_ids": [int(i) for i in reply],
            "reply_tokens": [_decode(tokenizer, [i]) for i in reply],
            "tool": turn.tool, "arguments": turn.arguments, "action": turn.action, "repair": turn.repair,
            "observation": _decode(tokenizer, observation),
            "observation_tokens": len(observation),
        })
    row = {**rundir.episode_record(t), "env_stats": dict(t.env_stats),
           "prompt": _decode(tokenizer, ids[: t.prompt_length]), "prompt_tokens": t.prompt_length,
           "transcript": turns}
    if task is not None:
        row["task"] = task_goal(task)
    return row
