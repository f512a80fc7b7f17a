"""The run's front page as plain text: what `intraskill quickstart` and `intraskill eval` print last.

    print(format_summary("runs/quickstart"))

The four test conditions (the run's reward, strict reward, success), the paired differences with
their intervals and flips, what the skill bank did at each gate and whether the gate had evidence,
the training funnel, and where the report and TensorBoard are. The numbers are the report's own:
the run directory is read by the report's loader and its figures computed as the bundle computes
them (`bundle.figures_of_run`). Each piece a run does not have yet is one line saying so.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from etils import epath

from intraskill_jax import rundir
from intraskill_jax.analysis import results
from intraskill_jax.analysis.bundle import figures_of_run
from intraskill_jax.analysis.rundata import load_run
from intraskill_jax.analysis.training import BANK_ACTIONS, describe_evidence


def format_summary(workdir: str | os.PathLike) -> str:
    """The summary of the run directory `workdir` (see the module docstring).

    Raises:
      RunDataError: `workdir` is not a run directory or holds no run records.
    """
    workdir = rundir.run_path(workdir)
    return format_figures(figures_of_run(load_run(workdir)), workdir)


def format_figures(figures: Mapping[str, Any], workdir: epath.Path) -> str:
    """The summary from a run's figures (figures.json's layout); `workdir` only names paths."""
    sections = (
        _header(figures, workdir),
        _conditions(figures, workdir),
        _comparisons(figures),
        _rounds(figures),
        _training(figures),
        _where(workdir),
    )
    return "\n\n".join(s for s in sections if s)


def _header(figures: Mapping[str, Any], workdir: epath.Path) -> str:
    run = figures["run"]
    reward = run.get("reward")
    line = (
        f"IntraSkill run {workdir}: {run['steps']} training steps logged, "
        f"{run['rounds_closed']} round(s) closed by a gate"
        + (f"; trained on the {reward} reward" if reward else "")
    )
    if run["problems"]:
        line += (
            f"\n{run['problems']} incomplete or damaged record(s) in the run directory: "
            "the report's overview page lists them"
        )
    return line


def _conditions(figures: Mapping[str, Any], workdir: epath.Path) -> str:
    table = figures["conditions"]
    if not table:
        return (
            "Test conditions: no evaluation yet (eval/outcomes.jsonl is absent); run "
            f"`intraskill eval --config=CONFIG --workdir={workdir}`"
        )
    reward = figures["run"].get("reward")
    note = f"; {results.reward_label(reward)} is the reward the run trained on" if reward else ""
    return f"Test conditions, means over the test tasks{note}\n" + results.format_condition_table(table, reward)


def _comparisons(figures: Mapping[str, Any]) -> str:
    comps = figures["comparisons"]
    if not comps:
        return "" if not figures["conditions"] else "Paired differences: no pair of the four conditions was run"
    return (
        "Paired differences a - b on the same tasks (paired bootstrap 95% intervals; "
        "+ newly succeed, - regress; exact McNemar)\n" + results.format_comparisons(comps)
    )


def _rounds(figures: Mapping[str, Any]) -> str:
    rounds = figures["rounds"]
    if not rounds:
        return "Skill bank: no gate has closed a round yet"
    head = ["gate", "step", "tasks", "new bank", *BANK_ACTIONS.values(), "active", "evidence"]
    rows = [
        [str(r["round"]), str(r["step"]), _count(r["n"]), r["skill"] or "not written",
         *(_count(r[f"n_{a}"]) for a in BANK_ACTIONS), _count(r["active"]), describe_evidence(r)]
        for r in rounds
    ]
    return (
        "Skill bank: gate K closes round K and writes round K+1's bank\n"
        + results.text_table(head, rows, right=(0, 1, 2, 4, 5, 6, 7, 8))
    )


def _training(figures: Mapping[str, Any]) -> str:
    f = figures["training_funnel"]
    if not f["steps"]:
        return "Training: no step logged yet (metrics.jsonl is absent or empty)"
    parts = [f"Training: {f['steps']} steps"]
    if f["episodes_generated"] is not None:
        admitted = f["episodes_admitted"]
        share = f" ({f['admitted_share']:.1%})" if f["admitted_share"] is not None else ""
        parts.append(
            f"{f['episodes_generated']} episodes generated, "
            f"{_count(admitted)} admitted to the update{share}"
        )
    if f["steps_updated"] is not None:
        parts.append(f"{f['steps_updated']} of {f['steps_with_update']} steps updated the policy")
    return "; ".join(parts)


def _where(workdir: epath.Path) -> str:
    index = rundir.report_dir(workdir) / "index.html"
    report = str(index) if index.is_file() else f"not built yet: `intraskill report --workdir {workdir}`"
    return f"Report:      {report}\nTensorBoard: tensorboard --logdir {rundir.tensorboard_dir(workdir)}"


def _count(x: Any) -> str:
    return "n/a" if x is None else str(x)
