"""Small worlds whose right answer is known, for tests that must show the loop learns.

`CueEnv` is a one-decision episode: the page names a colour and the right click depends on it
(`click[left]` for red, `click[right]` for blue). Nothing is copied from the context; a policy
has to read one word and map it to one of two actions, which a tiny model learns in seconds and
which GRPO can teach it from the reward alone. It speaks the interface the agent loop uses
(`reset`, `step`, `available_actions`, `lang`, `config`, `stats`, `done`), so the real episode
runner, collection and learner run on it unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from sim.config import EnvConfig
from sim.env import EpisodeStats, StepResult

CUES = ("red", "blue")
ANSWERS = {"red": "left", "blue": "right"}
PROMPT = "Signal: {cue}. Click left or right."


def cue_of(task_id: int) -> str:
    return CUES[task_id % 2]


class CueEnv:
    """Task t shows the cue `cue_of(t)`; one click ends the episode with reward 1 if it is right."""

    lang = "en"

    def __init__(self) -> None:
        self.config = EnvConfig(reward="strict")
        self.stats = EpisodeStats()
        self.done = True
        self.task_id = -1

    def reset(self, task_id: int) -> StepResult:
        self.task_id, self.done, self.stats = int(task_id), False, EpisodeStats()
        return StepResult(PROMPT.format(cue=cue_of(self.task_id)), 0.0, False, {"view": {"task_id": self.task_id}})

    def available_actions(self) -> dict[str, Any]:
        return {"has_search_bar": False, "clickables": ["left", "right"]}

    def step(self, action: str) -> StepResult:
        self.stats.steps += 1
        self.done = True
        right = action.strip().lower() == f"click[{ANSWERS[cue_of(self.task_id)]}]"
        r = float(right)
        detail = {"r_type": r, "r_att": r, "r_option": r, "r_price": r, "loose": r, "strict": r, "success": r,
                  "correct_product": r, "num_attr_matches": 0, "num_option_matches": 0}
        return StepResult("Done.", r, True, {"reward_detail": detail, "stats": dataclasses.asdict(self.stats)})
