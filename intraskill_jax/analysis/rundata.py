"""Loading a run directory (see `intraskill_jax/rundir.py`) for analysis.

A run may be finished, still going, or killed: the loader keeps every record that is complete and
turns everything else into a `Problem` that names the file and says what is wrong and what the
report does about it. `load_run(..., strict=True)` raises instead, for callers that must not
work from partial data.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from etils import epath

from intraskill_jax import rundir
from intraskill_jax.skills.bank import BankFormatError, SkillBank

ProblemKind = Literal["missing", "corrupt", "incomplete", "mismatch"]

EPISODE_REQUIRED = ("task_id", "reward", "success")
GATE_REQUIRED = ("round", "step", "columns", "beta", "decisions", "summary")


@dataclasses.dataclass(frozen=True)
class Problem:
    """One file that is missing, damaged or inconsistent; `path` is relative to the run or bundle."""

    path: str
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return dataclasses.asdict(self)


class AnalysisInputError(ValueError):
    """Input the analysis cannot use as it is; `problems` names every file involved."""

    def __init__(self, what: str, problems: Sequence[Problem]):
        self.problems = tuple(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{what}:\n{lines}")

    @property
    def path(self) -> str:
        """The first file named (what a one-line CLI message leads with)."""
        return self.problems[0].path if self.problems else ""


class RunDataError(AnalysisInputError):
    """A run directory that cannot be read (or, with strict=True, is incomplete)."""


@dataclasses.dataclass
class RunData:
    """Everything analysis needs from one run, as JSON-able records."""

    workdir: epath.Path
    config: dict[str, Any]
    metrics: list[dict[str, Any]]  # metrics.jsonl rows as written
    rollouts: list[dict[str, Any]]  # training episodes of every step, sorted by step
    gates: list[dict[str, Any]]  # gates/round_K.json, sorted by round
    gate_episodes: list[dict[str, Any]]  # validation episodes of every gate
    outcomes: list[dict[str, Any]]  # eval/outcomes.jsonl
    skills: list[dict[str, Any]]  # skill_record() of every round, sorted by round
    problems: list[Problem]
    traces: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # eval/traces.jsonl
    # provenance.jsonl's session and stage rows, and the policy's model (`read_model`)
    provenance: dict[str, Any] = dataclasses.field(default_factory=dict)


def read_jsonl_lenient(
    path: epath.Path, rel: str, problems: list[Problem], required: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """JSON-object lines of `path`; a bad line (torn, not an object, missing a field) is a problem.

    Rows before and after a bad line are kept: a torn last line is the usual trace of a kill, and
    one damaged record should not hide the rest of a run.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        problems.append(Problem(rel, "missing", f"cannot read ({e.strerror})"))
        return []
    rows: list[dict[str, Any]] = []
    lines = text.split("\n")
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            torn = i == len(lines) - 1  # no newline after it: the write stopped mid-line
            problems.append(
                Problem(
                    rel,
                    "incomplete" if torn else "corrupt",
                    f"line {i + 1} is {'a torn last line' if torn else 'not JSON'} "
                    f"({line[:60]!r}); skipped",
                )
            )
            continue
        if not isinstance(row, dict):
            problems.append(Problem(rel, "corrupt", f"line {i + 1} is not a JSON object; skipped"))
            continue
        absent = [k for k in required if k not in row]
        if absent:
            problems.append(Problem(rel, "corrupt", f"line {i + 1} lacks {absent}; skipped"))
            continue
        rows.append(row)
    return rows


def skill_record(bank: SkillBank) -> dict[str, Any]:
    """A bank round as plain JSON: every chunk's text in both languages and the round's ledger."""
    return {
        "round": bank.round,
        "name": bank.name,
        "description": bank.description,
        "chunks": [
            {
                "id": c.id,
                "title": c.title,
                "status": c.status,
                "revision": c.revision,
                "en": c.en,
                "zh": c.zh,
            }
            for c in bank.chunks
        ],
        "ledger": [e.to_json() for e in bank.ledger],
        # Whether the gate that wrote this round had outcomes to decide on ({"informative",
        # "reason"}); None for round 0 and for runs from before the gate recorded it.
        "evidence": bank.ledger_extra.get("evidence"),
    }


def load_run(workdir: rundir.PathLike, *, strict: bool = False) -> RunData:
    """Reads a run directory; problems are collected (or raised with `strict`).

    Raises:
      RunDataError: `workdir` is not a directory, holds no run record at all, or (strict) any
        problem was found.
    """
    root = rundir.run_path(workdir)
    if not root.is_dir():
        raise RunDataError(
            f"no run directory at {root}", [Problem(str(root), "missing", "not a directory")]
        )
    problems: list[Problem] = []
    config = _read_config(root, problems)
    metrics = _read_metrics(root, problems)
    rollouts = _read_rollouts(root, metrics, problems)
    gates, gate_episodes = _read_gates(root, problems)
    skills = _read_skills(root, gates, problems)
    outcomes: list[dict[str, Any]] = []
    traces: list[dict[str, Any]] = []
    if rundir.eval_outcomes_path(root).is_file():
        outcomes = read_jsonl_lenient(
            rundir.eval_outcomes_path(root),
            "eval/outcomes.jsonl",
            problems,
            ("condition", *EPISODE_REQUIRED),
        )
        outcomes = _one_per_condition_and_task(outcomes, problems)
        traces = _read_traces(root, problems)
    provenance = {**_read_provenance(root, problems), "model": read_model(root, config)}
    _note_unfinished_round(metrics, gates, problems)
    if not (metrics or rollouts or gates or skills or outcomes):
        raise RunDataError(
            f"{root} holds no run records (metrics.jsonl, rollouts/, gates/, skills/, eval/)",
            problems or [Problem(str(root), "missing", "empty run directory")],
        )
    if strict and problems:
        raise RunDataError(f"run directory {root} is incomplete or damaged", problems)
    return RunData(root, config, metrics, rollouts, gates, gate_episodes, outcomes, skills, problems, traces, provenance)


def _read_traces(root: epath.Path, problems: list[Problem]) -> list[dict[str, Any]]:
    path = rundir.eval_traces_path(root)
    if not path.is_file():
        problems.append(Problem("eval/traces.jsonl", "missing",
                                "absent (an evaluation from before traces were written): the report shows no trace"))
        return []
    return read_jsonl_lenient(path, "eval/traces.jsonl", problems, ("condition", "transcript", *EPISODE_REQUIRED))


def _read_provenance(root: epath.Path, problems: list[Problem]) -> dict[str, list[dict[str, Any]]]:
    """Session rows (versions, machine, splits) and stage rows (wall times) of provenance.jsonl."""
    path = rundir.provenance_path(root)
    if not path.is_file():
        problems.append(Problem("provenance.jsonl", "missing", "absent (a run from before it was written): "
                                "the report shows no versions, machine or stage times"))
        return {"sessions": [], "stages": []}
    rows = read_jsonl_lenient(path, "provenance.jsonl", problems, ("kind",))
    return {"sessions": [r for r in rows if r["kind"] == "session"],
            "stages": [r for r in rows if r["kind"] == "stage"]}


def read_model(root: epath.Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """The trained policy's HF config.json and parameter count (from its safetensors headers, no
    weights read), or the starting policy's while training has not finished; {} when neither is
    there (the report then leaves the model's facts out)."""
    final = rundir.final_policy_dir(root)
    start = (config.get("policy") or {}).get("path") or ""
    candidates = [("trained policy", final), ("starting policy", rundir.base_policy_dir(root))]
    if start:
        candidates.append(("starting policy", rundir.run_path(start)))
    for which, directory in candidates:
        try:
            hf_config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
            parameters, dtypes = _safetensors_parameters(directory)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        return {"which": which, "path": str(directory), "policy_path": start, "config": hf_config,
                "parameters": parameters, "dtypes": dtypes}
    return {}


def _safetensors_parameters(directory: epath.Path) -> tuple[int, dict[str, int]]:
    """Element count of every tensor stored in `directory` (and per dtype), from the headers alone."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    total, dtypes = 0, {}
    for name in files:
        with (directory / name).open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
        for key, entry in header.items():
            if key == "__metadata__":
                continue
            n = math.prod(entry["shape"])
            total += n
            dtypes[entry["dtype"]] = dtypes.get(entry["dtype"], 0) + n
    return total, dtypes


def _read_config(root: epath.Path, problems: list[Problem]) -> dict[str, Any]:
    path = rundir.config_path(root)
    if not path.is_file():
        problems.append(Problem("config.json", "missing", "absent; the bundle carries {}"))
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        problems.append(Problem("config.json", "corrupt", f"not JSON ({e.msg}); the bundle carries {{}}"))
        return {}
    if not isinstance(doc, dict):
        problems.append(Problem("config.json", "corrupt", "not a JSON object; the bundle carries {}"))
        return {}
    return doc


def _read_metrics(root: epath.Path, problems: list[Problem]) -> list[dict[str, Any]]:
    path = rundir.metrics_path(root)
    if not path.is_file():
        problems.append(Problem("metrics.jsonl", "missing", "absent: no training dynamics"))
        return []
    rows = read_jsonl_lenient(path, "metrics.jsonl", problems, ("step",))
    good = []
    for row in rows:
        if isinstance(row["step"], int) and not isinstance(row["step"], bool):
            good.append(row)
        else:
            problems.append(Problem("metrics.jsonl", "corrupt", f"step {row['step']!r} is not an integer; row skipped"))
    return good


def _read_rollouts(
    root: epath.Path, metrics: Sequence[Mapping[str, Any]], problems: list[Problem]
) -> list[dict[str, Any]]:
    files = rundir.rollout_files(root)
    # Steps are contiguous, so a gap between step files is a lost file. A step that logged rollout
    # metrics also finished its rollouts; the writer may number files from 0 and metric rows from
    # 1 (logged after the step counter moves), so metric steps are aligned on the first file.
    expected = set(range(min(files), max(files) + 1)) if files else set()
    logged = sorted({int(r["step"]) for r in metrics if any(k.startswith("rollout/") for k in r)})
    if logged:
        offset = logged[0] - min(files) if files else 0
        expected |= {s - offset for s in logged}
    for step in sorted(expected - set(files)):
        problems.append(
            Problem(
                f"rollouts/step_{step:06d}.jsonl",
                "missing",
                f"step {step}'s episode file is absent (neighbouring steps or metrics.jsonl show "
                "the step ran); group summaries skip that step",
            )
        )
    rows: list[dict[str, Any]] = []
    for step, p in sorted(files.items()):
        rel = f"rollouts/{p.name}"
        for row in read_jsonl_lenient(p, rel, problems, ("group", *EPISODE_REQUIRED)):
            if row.get("step", step) != step:
                problems.append(
                    Problem(rel, "mismatch", f"row says step {row.get('step')}, file is step {step}; kept as {step}")
                )
            rows.append({**row, "step": step})
    return rows


def _read_gates(
    root: epath.Path, problems: list[Problem]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    gates: list[dict[str, Any]] = []
    episodes: list[dict[str, Any]] = []
    for k, p in rundir.gate_files(root).items():
        rel = f"gates/{p.name}"
        try:
            doc = json.loads(p.read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            problems.append(Problem(rel, "corrupt", f"not JSON ({e.msg}); round {k} left out"))
            continue
        absent = [key for key in GATE_REQUIRED if not isinstance(doc, dict) or key not in doc]
        if absent:
            problems.append(Problem(rel, "corrupt", f"lacks {absent}; round {k} left out"))
            continue
        if doc["round"] != k:
            problems.append(Problem(rel, "mismatch", f"says round {doc['round']}, file name round {k}; left out"))
            continue
        gates.append(doc)
        ep_path = rundir.gate_episodes_path(root, k)
        ep_rel = f"gates/round_{k}_episodes.jsonl"
        if not ep_path.is_file():
            problems.append(
                Problem(ep_rel, "missing", f"round {k}'s validation episodes are absent; its behaviour is left out")
            )
            continue
        for row in read_jsonl_lenient(ep_path, ep_rel, problems, ("arm", *EPISODE_REQUIRED)):
            episodes.append({**row, "round": k, "step": row.get("step", doc["step"])})
    return gates, episodes


def _read_skills(
    root: epath.Path, gates: Sequence[Mapping[str, Any]], problems: list[Problem]
) -> list[dict[str, Any]]:
    last = rundir.latest_round(root)
    skills: list[dict[str, Any]] = []
    rounds = set(range(last + 1)) if last is not None else set()
    # Gate K closes round K and writes round K+1's bank: each closed round implies the next bank.
    rounds |= {int(g["round"]) + 1 for g in gates}
    for k in sorted(rounds):
        try:
            skills.append(skill_record(SkillBank.load_round(root, k)))
        except BankFormatError as e:
            missing = not rundir.ledger_path(root, k).is_file()
            why = (
                "the bank was never written (run stopped mid-round?)"
                if missing
                else f"unreadable ({e})"
            )
            problems.append(
                Problem(f"skills/round_{k}", "missing" if missing else "corrupt", f"round {k}: {why}")
            )
    return skills


def _one_per_condition_and_task(
    rows: list[dict[str, Any]], problems: list[Problem]
) -> list[dict[str, Any]]:
    """Paired analysis needs one episode per (condition, task): later repeats are dropped."""
    seen: set[tuple[str, int]] = set()
    kept, dropped = [], 0
    for r in rows:
        key = (str(r["condition"]), int(r["task_id"]))
        if key in seen:
            dropped += 1
            continue
        seen.add(key)
        kept.append(r)
    if dropped:
        problems.append(
            Problem(
                "eval/outcomes.jsonl",
                "corrupt",
                f"{dropped} repeated (condition, task) episode(s); the first of each is used",
            )
        )
    return kept


def _note_unfinished_round(
    metrics: Iterable[Mapping[str, Any]], gates: Sequence[Mapping[str, Any]], problems: list[Problem]
) -> None:
    """Steps after the last gate form a round that never reached its gate (normal while running)."""
    steps = sorted({int(r["step"]) for r in metrics})
    last_gate = max((int(g["step"]) for g in gates), default=None)
    tail = [s for s in steps if last_gate is None or s > last_gate]
    if tail:
        problems.append(
            Problem(
                "metrics.jsonl",
                "incomplete",
                f"steps {tail[0]}-{tail[-1]} came after the last gate "
                f"({'none yet' if last_gate is None else f'step {last_gate}'}): "
                f"round {len(gates)} has not closed; its training dynamics are shown, "
                "it has no contribution estimates yet",
            )
        )
