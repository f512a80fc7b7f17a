"""Small worlds whose right answer is known, for tests that must show the loop learns.

`CueEnv` is a one-decision episode: the page names a colour and the right click depends on it
(`click[left]` for red, `click[right]` for blue). Nothing is copied from the context; a policy
has to read one word and map it to one of two actions, which a tiny model learns in seconds and
which GRPO can teach it from the reward alone. `SignalEnv` is its multi-turn form: the colour
arrives only in a tool response, and an episode takes three turns. Both speak the interface the
agent loop uses (`reset`, `step`, `available_actions`, `lang`, `config`, `stats`, `done`), so the
real episode runner, collection and learner run on them unchanged.
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
        return finished(action.strip().lower() == f"click[{ANSWERS[cue_of(self.task_id)]}]", self.stats)


def finished(success: bool, stats: EpisodeStats) -> StepResult:
    """The last step of a toy episode: every reward component is 1 on success, else 0."""
    r = float(success)
    detail = {"r_type": r, "r_att": r, "r_option": r, "r_price": r, "loose": r, "strict": r, "success": r,
              "correct_product": r, "num_attr_matches": 0, "num_option_matches": 0}
    return StepResult("Done.", r, True, {"reward_detail": detail, "stats": dataclasses.asdict(stats)})


LOOK_PROMPT = "Click look to see the signal."
CONFIRM = "Noted. Click confirm."
SIGNAL_STEPS = ("look", "side", "confirm")


class SignalEnv(CueEnv):
    """Three turns: `click[look]` shows the cue of task t (in the tool response: the first page has
    none), then the side click (`ANSWERS`), then `click[confirm]`. Any other action ends the episode
    with reward 0; the confirm pays 1 when the side was right. The page after the side click is the
    same either way, so the reward is the only verdict."""

    def reset(self, task_id: int) -> StepResult:
        self.task_id, self.done, self.stats = int(task_id), False, EpisodeStats()
        self.stage, self.right = 0, False
        return StepResult(LOOK_PROMPT, 0.0, False, {"view": {"task_id": self.task_id}})

    def available_actions(self) -> dict[str, Any]:
        clickables = (["look"], ["left", "right"], ["confirm"])[self.stage]
        return {"has_search_bar": False, "clickables": clickables}

    def step(self, action: str) -> StepResult:
        self.stats.steps += 1
        action = action.strip().lower()
        step = SIGNAL_STEPS[self.stage]
        if step == "look" and action == "click[look]":
            self.stage = 1
            return StepResult(PROMPT.format(cue=cue_of(self.task_id)), 0.0, False, {})
        if step == "side" and action in ("click[left]", "click[right]"):
            self.stage, self.right = 2, action == f"click[{ANSWERS[cue_of(self.task_id)]}]"
            return StepResult(CONFIRM, 0.0, False, {})
        self.done = True
        return finished(step == "confirm" and action == "click[confirm]" and self.right, self.stats)
