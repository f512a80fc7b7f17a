"""The bundle: a run's records in one shareable folder that anyone can re-analyse without a model.

    <workdir>/bundle/
      manifest.json              SHA-256 and size of every other file
      config.json                the run config
      problems.json              what the run directory lacked or had damaged when bundled
      metrics.jsonl              per-step metrics (one row per step, scopes merged)
      groups.jsonl               per-group summaries of the training episodes
      gates.json                 every gate document (fit, decisions, summary, funnel)
      validation_episodes.jsonl  the gates' validation episodes (same tasks at each checkpoint)
      outcomes.jsonl             test episodes, one per (condition, task): the paired outcomes
      traces.jsonl               a few test episodes whole: every turn's observation, reply and tokens
      provenance.json            versions, machine, split sizes, stage wall times, the policy's model
      skills/round_K.json        each round's chunks (en and zh) and ledger
      contributions.jsonl        derived: each column's estimate and interval per gate
      paired_outcomes.jsonl      derived: one row per task across conditions
      figures.json               derived: every number the report shows

The derived files are computed from the bundle's own primary files (never from the run), so
`check_bundle` can verify every hash and then recompute them and compare. Nothing here imports JAX.
A bundle may live on gs:// like its run; its manifest, written last, is its commit file.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from etils import epath

from sim import flagparse

from intraskill_jax import rundir
from intraskill_jax.analysis import behaviour, overview, results, training
from intraskill_jax.analysis.rundata import (
    AnalysisInputError,
    Problem,
    RunData,
    load_run,
    read_jsonl_lenient,
)

log = logging.getLogger(__name__)

# /2: conditions and comparisons report the run's own reward as `reward` (it was the strict one)
# besides `strict` and `success`; `rounds` and `training_funnel` are new.
# /3: traces.jsonl and provenance.json; series carry a trailing 5-step mean (no EMA); figures gain
# `headline`, `protocol`, `controls` and `traces`.
BUNDLE_FORMAT = "intraskill-bundle/3"
MANIFEST = "manifest.json"
# name -> JSON kind ("doc" one document, "rows" JSON lines); skills/round_K.json come on top.
PRIMARY = {
    "config.json": "doc",
    "problems.json": "doc",
    "metrics.jsonl": "rows",
    "groups.jsonl": "rows",
    "gates.json": "doc",
    "validation_episodes.jsonl": "rows",
    "outcomes.jsonl": "rows",
    "traces.jsonl": "rows",
    "provenance.json": "doc",
}
DERIVED = {
    "contributions.jsonl": "rows",
    "paired_outcomes.jsonl": "rows",
    "figures.json": "doc",
}
# Fixed so that a recomputation anywhere reproduces the stored intervals bit for bit.
SETTINGS = {"bootstrap_resamples": 9999, "bootstrap_seed": 0, "confidence": 0.95, "mean_window": 5}
REL_TOL, ABS_TOL = 1e-9, 1e-12


class BundleError(AnalysisInputError):
    """A bundle that is incomplete, altered, or whose figures do not follow from its data."""


@dataclasses.dataclass
class BundleData:
    """A bundle's primary records (and figures.json when present)."""

    root: epath.Path
    config: dict[str, Any]
    problems: list[dict[str, Any]]
    metrics: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    gates: list[dict[str, Any]]
    validation_episodes: list[dict[str, Any]]
    outcomes: list[dict[str, Any]]
    skills: list[dict[str, Any]]
    traces: list[dict[str, Any]]
    provenance: dict[str, Any]
    figures: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class BundleCheck:
    """What `check_bundle` verified."""

    files: int  # hashes verified
    values: int  # numbers and strings of the derived files compared with the recomputation


# -- building ---------------------------------------------------------------------------------


def build_bundle(
    workdir: rundir.PathLike, out: rundir.PathLike | None = None, *, run: RunData | None = None
) -> epath.Path:
    """Writes `<workdir>/bundle/` (or `out`) from a run directory and returns its path.

    The bundle is assembled in a temporary directory and published whole (`rundir.publish_dir`,
    the manifest last), so an old bundle is never left half overwritten. Problems found in the
    run are logged and stored in problems.json; what is complete is bundled.
    """
    run = run if run is not None else load_run(workdir)
    for p in run.problems:
        log.warning("%s", p)

    def assemble(tmp: Path) -> None:
        _write_primary(tmp, run)
        data = read_bundle(tmp)
        for name, content in derive(data).items():
            _write(tmp / name, DERIVED[name], content)
        write_manifest(tmp)

    dest = rundir.run_path(out) if out is not None else rundir.bundle_dir(workdir)
    return rundir.publish_dir(dest, assemble, commit_file=MANIFEST)


def primary_records(run: RunData) -> dict[str, Any]:
    """The bundle's primary files (name -> content) as they follow from a run directory."""
    records: dict[str, Any] = {
        "config.json": run.config,
        "problems.json": [p.to_json() for p in run.problems],
        "metrics.jsonl": training.merge_steps(run.metrics),
        "groups.jsonl": training.group_summaries(run.rollouts),
        "gates.json": run.gates,
        "validation_episodes.jsonl": run.gate_episodes,
        "outcomes.jsonl": run.outcomes,
        "traces.jsonl": run.traces,
        "provenance.json": run.provenance,
    }
    for s in run.skills:
        records[f"skills/round_{s['round']}.json"] = s
    return records


def _write_primary(root: rundir.PathLike, run: RunData) -> None:
    for name, content in primary_records(run).items():
        _write(root / name, PRIMARY.get(name, "doc"), content)


def figures_of_run(run: RunData) -> dict[str, Any]:
    """The figures a bundle of `run` would hold, without writing one (the terminal summary's).

    The records pass through the same JSON cleaning as the bundle's files, so every number is
    the one the report shows.
    """
    records = _json_clean(primary_records(run))
    skills = [records[f"skills/round_{s['round']}.json"] for s in run.skills]
    return compute_figures(_bundle_data(rundir.bundle_dir(run.workdir), records, skills))


def _bundle_data(root: epath.Path, docs: dict[str, Any], skills: list[Any], figures: Any = None) -> BundleData:
    """A bundle's contents from its primary files (name -> content)."""
    return BundleData(
        root=root,
        config=docs["config.json"],
        problems=docs["problems.json"],
        metrics=docs["metrics.jsonl"],
        groups=docs["groups.jsonl"],
        gates=docs["gates.json"],
        validation_episodes=docs["validation_episodes.jsonl"],
        outcomes=docs["outcomes.jsonl"],
        traces=docs["traces.jsonl"],
        provenance=docs["provenance.json"],
        skills=skills,
        figures=figures,
    )


def _write(path: rundir.PathLike, kind: str, content: Any) -> None:
    clean = _json_clean(content)
    if kind == "rows":
        text = "".join(json.dumps(r, ensure_ascii=False, allow_nan=False) + "\n" for r in clean)
    else:
        text = json.dumps(clean, ensure_ascii=False, indent=1, allow_nan=False) + "\n"
    rundir.write_text(path, text)


def _json_clean(x: Any) -> Any:
    """JSON has no NaN or infinity (and other readers reject them): they become null."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, Mapping):
        return {str(k): _json_clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_json_clean(v) for v in x]
    return x


def sha256(path: rundir.PathLike) -> str:
    h = hashlib.sha256()
    with rundir.run_path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def bundle_files(root: rundir.PathLike) -> list[str]:
    """Every file of the bundle but the manifest, as sorted POSIX paths relative to `root`."""
    return [rel for rel in rundir.list_files(root) if rel != MANIFEST]


def write_manifest(root: rundir.PathLike) -> epath.Path:
    root = rundir.run_path(root)
    files = {
        rel: {"sha256": sha256(root / rel), "bytes": (root / rel).stat().length}
        for rel in bundle_files(root)
    }
    _write(root / MANIFEST, "doc", {"format": BUNDLE_FORMAT, "files": files})
    return root / MANIFEST


# -- reading ----------------------------------------------------------------------------------


def read_bundle(root: str | os.PathLike) -> BundleData:
    """Reads a bundle's records without checking hashes (see `load_bundle`).

    Raises:
      BundleError: a file is missing or does not parse, naming it.
    """
    root = rundir.run_path(root)
    problems: list[Problem] = []
    docs: dict[str, Any] = {}
    for name, kind in PRIMARY.items():
        docs[name] = _read(root, name, kind, problems)
    skills = []
    for p in sorted((root / "skills").glob("round_*.json"), key=_round_of):
        doc = _read(root, p.relative_to(root).as_posix(), "doc", problems)
        if doc is not None:
            skills.append(doc)
    figures = _read(root, "figures.json", "doc", []) if (root / "figures.json").is_file() else None
    if problems:
        raise BundleError(f"bundle {root} cannot be read", problems)
    return _bundle_data(root, docs, skills, figures)


def load_bundle(root: str | os.PathLike, *, verify: bool = True) -> BundleData:
    """Reads a bundle, first verifying every hash in its manifest (unless `verify` is False)."""
    if verify:
        verify_hashes(root)
    return read_bundle(root)


def _read(root: epath.Path, rel: str, kind: str, problems: list[Problem]) -> Any:
    path = root / rel
    if not path.is_file():
        problems.append(Problem(rel, "missing", "not in the bundle"))
        return None
    if kind == "rows":
        return read_jsonl_lenient(path, rel, problems)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        problems.append(Problem(rel, "corrupt", f"not JSON ({e})"))
        return None


def _round_of(p: epath.Path) -> int:
    digits = p.stem.removeprefix("round_")
    return int(digits) if digits.isdigit() else -1


# -- derived files ----------------------------------------------------------------------------


def derive(data: BundleData) -> dict[str, Any]:
    """The derived files' contents, from the primary records only."""
    return {
        "contributions.jsonl": training.contribution_history(data.gates, data.skills),
        "paired_outcomes.jsonl": results.paired_outcomes(data.outcomes),
        "figures.json": compute_figures(data),
    }


def compute_figures(data: BundleData) -> dict[str, Any]:
    """Every number the report shows, computed from a bundle's primary records."""
    series = training.training_series(data.metrics, SETTINGS["mean_window"])
    final = {}
    for name, s in series.items():
        last = max((i for i, v in enumerate(s["raw"]) if v is not None), default=None)
        if last is not None:
            final[name] = {"step": s["step"][last], "raw": s["raw"][last], "mean": s["mean"][last]}
    steps = [int(r["step"]) for r in data.metrics]
    conditions = results.condition_table(data.outcomes)
    comparisons = results.paired_comparisons(
        data.outcomes,
        confidence=SETTINGS["confidence"],
        n_resamples=SETTINGS["bootstrap_resamples"],
        seed=SETTINGS["bootstrap_seed"],
    )
    return {
        "format": BUNDLE_FORMAT,
        "settings": dict(SETTINGS),
        "run": {
            "steps": len(steps),
            "first_step": min(steps, default=None),
            "last_step": max(steps, default=None),
            "rounds_closed": len(data.gates),
            "skill_rounds": len(data.skills),
            "train_groups": len(data.groups),
            "train_episodes": sum(int(g["n"]) for g in data.groups),
            "validation_episodes": len(data.validation_episodes),
            "eval_episodes": len(data.outcomes),
            "conditions": len(conditions),
            "problems": len(data.problems),
            "reward": results.reward_name(data.config),
            "preset": overview.preset(data.config),
            **overview.key_counts(data.skills, data.provenance),
        },
        "headline": overview.headline(comparisons),
        "conditions": conditions,
        "comparisons": comparisons,
        "behaviour": {
            "by_condition": behaviour.behaviour_by_condition(data.outcomes),
            "by_checkpoint": behaviour.behaviour_across_checkpoints(data.validation_episodes),
        },
        "training": {
            "headline": training.headline_metrics(series),
            "final": final,
            "series": series,
        },
        "groups": training.step_group_stats(data.groups, training.rollout_step_offset(data.metrics, data.groups)),
        "training_funnel": training.training_funnel(data.metrics),
        "gates": training.gate_summaries(data.gates),
        "rounds": training.bank_rounds(data.gates, data.skills),
        "contributions": training.contribution_history(data.gates, data.skills),
        "funnel": training.failure_funnel(data.gates),
        "skills": [_skill_counts(s) for s in data.skills],
        "protocol": overview.protocol(data.config, data.provenance),
        "controls": overview.controls(data.config),
        "traces": overview.traces(data.traces),
    }


def _skill_counts(s: Mapping[str, Any]) -> dict[str, Any]:
    chunks = s.get("chunks", [])
    actions = [e.get("action") for e in s.get("ledger", [])]
    return {
        "round": int(s["round"]),
        "name": s.get("name"),
        "active": sum(c.get("status") == "active" for c in chunks),
        "retired": sum(c.get("status") == "retired" for c in chunks),
        **{f"n_{a}": actions.count(a) for a in ("retain", "rewrite", "add", "retire")},
    }


# -- checking ---------------------------------------------------------------------------------


def verify_hashes(root: rundir.PathLike) -> int:
    """Checks the manifest against the files; returns how many files it verified.

    Raises:
      BundleError: naming every file that is missing, altered, truncated or not in the manifest.
    """
    root = rundir.run_path(root)
    manifest_path = root / MANIFEST
    if not root.is_dir():
        raise BundleError(f"no bundle at {root}", [Problem(str(root), "missing", "not a directory")])
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        listed = manifest["files"]
        if manifest.get("format") != BUNDLE_FORMAT or not isinstance(listed, dict):
            raise ValueError(
                f"format {manifest.get('format')!r}, expected {BUNDLE_FORMAT!r}; rebuild it from "
                "its run with `intraskill report --workdir RUN`"
            )
    except FileNotFoundError:
        raise BundleError(
            f"bundle {root} has no manifest", [Problem(MANIFEST, "missing", "absent; rebuild with `intraskill report`")]
        ) from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise BundleError(
            f"bundle {root} has an unreadable manifest", [Problem(MANIFEST, "corrupt", str(e))]
        ) from None
    problems: list[Problem] = []
    for name in [*PRIMARY, *DERIVED]:
        if name not in listed:
            problems.append(Problem(name, "missing", "the manifest does not list it"))
    for rel, entry in sorted(listed.items()):
        problems.extend(_check_file(root, rel, entry))
    for rel in bundle_files(root):
        if rel not in listed:
            problems.append(Problem(rel, "mismatch", "present but not in the manifest (added after bundling?)"))
    if problems:
        raise BundleError(f"bundle {root} does not match its manifest", problems)
    return len(listed)


def _check_file(root: epath.Path, rel: str, entry: Mapping[str, Any]) -> list[Problem]:
    path = root / rel
    if not path.is_file():
        return [Problem(rel, "missing", "listed in the manifest but absent (deleted?)")]
    size = path.stat().length
    if sha256(path) == entry.get("sha256") and size == entry.get("bytes"):
        return []
    expected = entry.get("bytes")
    if isinstance(expected, int) and size < expected:
        detail = f"truncated: {size} bytes, the manifest says {expected}"
        if rel.endswith(".jsonl") and not path.read_bytes().endswith(b"\n"):
            detail += "; its last line is cut off"
        return [Problem(rel, "incomplete", detail)]
    return [Problem(rel, "mismatch", f"SHA-256 differs from the manifest ({size} bytes, manifest {expected}): altered after bundling")]


def check_bundle(root: rundir.PathLike) -> BundleCheck:
    """Verifies every hash, then recomputes the derived files from the primary records and compares.

    Needs no model and no JAX: only the bundle and this package's analysis code.

    Raises:
      BundleError: naming each file that is missing, altered or truncated, or each derived value
        that does not follow from the bundle's data (with its JSON pointer).
    """
    root = rundir.run_path(root)
    files = verify_hashes(root)
    data = read_bundle(root)
    problems: list[Problem] = []
    compared = 0
    try:
        derived = derive(data)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        # Records edited (and re-hashed) into a shape the analysis cannot read.
        raise BundleError(
            f"bundle {root}: its records cannot be analysed",
            [Problem(".", "corrupt", f"recomputing the derived files failed: {e!r}")],
        ) from None
    for name, content in derived.items():
        stored = _read(root, name, DERIVED[name], problems)
        expected = json.loads(json.dumps(_json_clean(content), ensure_ascii=False))
        diffs: list[str] = []
        compared += _compare(stored, expected, "", diffs)
        for d in diffs[:10]:
            problems.append(Problem(name, "mismatch", d))
        if len(diffs) > 10:
            problems.append(Problem(name, "mismatch", f"... and {len(diffs) - 10} more differences"))
    if problems:
        raise BundleError(f"bundle {root}: derived files do not follow from its data", problems)
    return BundleCheck(files=files, values=compared)


def _compare(stored: Any, expected: Any, pointer: str, diffs: list[str]) -> int:
    """Counts compared leaves; appends 'pointer: stored vs recomputed' for each difference."""
    if isinstance(expected, dict) and isinstance(stored, dict):
        n = 0
        for k in sorted(set(expected) | set(stored)):
            sub = f"{pointer}/{str(k).replace('~', '~0').replace('/', '~1')}"
            if k not in stored or k not in expected:
                diffs.append(f"{sub or '/'}: {'missing from the file' if k not in stored else 'not recomputed'}")
                continue
            n += _compare(stored[k], expected[k], sub, diffs)
        return n
    if isinstance(expected, list) and isinstance(stored, list):
        if len(expected) != len(stored):
            diffs.append(f"{pointer or '/'}: {len(stored)} entries in the file, {len(expected)} recomputed")
            return 0
        return sum(_compare(s, e, f"{pointer}/{i}", diffs) for i, (s, e) in enumerate(zip(stored, expected)))
    same = (
        math.isclose(stored, expected, rel_tol=REL_TOL, abs_tol=ABS_TOL)
        if _is_number(stored) and _is_number(expected)
        else stored == expected and type(stored) is type(expected)
    )
    if not same:
        diffs.append(f"{pointer or '/'}: {stored!r} in the file, {expected!r} recomputed from the bundle")
    return 1


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# -- command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """`intraskill check-bundle DIR`: exit 0 with a summary, or 1 naming each bad file. DIR is the
    bundle directory, or a run directory holding bundle/ (local or gs://)."""
    prog = "intraskill check-bundle"
    args = flagparse.parse(prog, main.__doc__, lambda values: None, argv, positional=("dir",))
    try:
        where = rundir.run_path(args.dir)
    except (ValueError, ImportError) as e:
        flagparse.usage_error(prog, str(e))
    if not (where / MANIFEST).exists() and (rundir.bundle_dir(where) / MANIFEST).is_file():
        where = rundir.bundle_dir(where)
    try:
        result = check_bundle(where)
    except BundleError as e:
        print(f"check-bundle: FAILED: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(
        f"check-bundle: OK: {where}: {result.files} files match the manifest; "
        f"{result.values} values of the derived files recomputed from the bundle alone"
    )


if __name__ == "__main__":
    main()
