"""The run directory: where each record of a run lives, how it is written, and the episode records.

    <workdir>/config.json                       the resolved run config
    <workdir>/metrics.jsonl                     one JSON object per (step, scope) write (metrics.py)
    <workdir>/tb/                               TensorBoard events
    <workdir>/base/                             the fresh starting policy, an HF directory (policy.py)
    <workdir>/sft/                              the warm start: checkpoints/, metrics, hf/ (warm_start.py)
    <workdir>/checkpoints/                      orbax (params, optimizer, step, RNG, cursor, bank round)
    <workdir>/hf/weight_vNNNNNN/                HF safetensors pushed to SGLang
    <workdir>/hf/final/, hf/final.json          the trained policy and the step it is from
    <workdir>/skills/round_K/                   the bank of round K and its ledger.json (skills/bank.py)
    <workdir>/rollouts/step_NNNNNN.jsonl        training episodes of a step (episode_trace + step fields)
    <workdir>/gates/round_K.json                the gate that closed round K (fit, decisions, funnel)
    <workdir>/gates/round_K_episodes.jsonl      its validation episodes (episode_record + arm, mask)
    <workdir>/eval/outcomes.jsonl               test episodes, one per (condition, task)
    <workdir>/eval/traces.jsonl                 a few of them whole, as text (transcript.py)
    <workdir>/provenance.jsonl                  versions, machine, split sizes, stage wall times (provenance.py)
    <workdir>/eval/ranking.jsonl                the ranking appendix's episodes (`intraskill rank`)
    <workdir>/bundle/, <workdir>/report/        the shareable copy with its SHA-256 manifest; the site

Storage. The workdir is a local path or a `gs://bucket/prefix` URL, and every path of a run is an
`etils.epath.Path` made by a function here, so one code path reads and writes both. epath rather
than fsspec directly: orbax, which writes the checkpoints, takes epath paths and already depends on
etils; its pathlib interface keeps the code that walks a run unchanged; and on gs:// it runs on
gcsfs (fsspec), or on tf.io.gfile where TensorFlow is installed. gs:// needs gcsfs (the `gcs`
extra), which `run_path` asks for before any work.

Commit points stay atomic on both:

* a record file is written whole (`write_text`, `write_json`, `write_jsonl`): locally to a
  temporary name, fsynced and renamed; on an object store as one object upload, which is atomic per
  object (there is no rename there, and no append: `JsonlLog` uploads the whole file again);
* a directory of several files (an HF export, the bundle) goes through `publish_dir`: locally it is
  written under a temporary name and renamed into place; on an object store its files are uploaded
  one by one and a commit file (`COMMIT_MARKER`, or the bundle's manifest) last, which readers
  check (`is_published`);
* a bank round commits with its `ledger.json`, written after the skill files (skills/bank.py);
* orbax commits checkpoints itself: locally by renaming `<step>.orbax-checkpoint-tmp` into place,
  on gs:// by writing `<step>/commit_success.txt` last; it never lists an unfinished step.

A killed run leaves each record complete or absent, and each directory committed or without its
commit file. `reached` marks the named points where a kill must be survivable (a test hook).

Several processes (a pod slice) share one workdir: process 0 alone writes, and every write here
(records, `JsonlLog` rows, published directories, removals) sits between a barrier named after its
path and an exchange of whether it failed, so every process reads the directory in the same state
at the same point of the run, a failed write raises on every process, and a process that strays to
another write fails at once (`distributed`). Code outside this
module writes the run directory only through it, except orbax (checkpoints, its own multi-process
protocol) and TensorBoard's event files (process 0 alone, `metrics.py`).
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
import fnmatch
import importlib.util
import json
import logging
import math
import os
import posixpath
import re
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

from intraskill_jax.agent.trajectory import Trajectory, Turn

log = logging.getLogger(__name__)

PathLike = str | os.PathLike
REMOTE_PREFIX = "gs://"
COMMIT_MARKER = "commit_success.txt"  # the last file of a published directory (orbax's name on GCS)
_COPY_CHUNK = 16 << 20

# -- the path layer --------------------------------------------------------------------------------


def run_path(where: PathLike) -> epath.Path:
    """`where` (a local path or a gs:// URL) as a path of the run layer.

    Raises:
      ValueError: a URL whose `//` was collapsed to `/` (it went through `pathlib.Path`, which would
        make a local folder named `gs:`), or a scheme other than gs://.
      ImportError: a gs:// URL without gcsfs (or TensorFlow) installed.
    """
    text = os.fspath(where)
    collapsed = re.match(r"^([a-z][a-z0-9+.-]*):/(?!/)", text)
    if collapsed:
        raise ValueError(f"{text!r} looks like a {collapsed.group(1)}:// URL that lost a slash (it went through "
                         f"pathlib.Path); pass the URL itself, e.g. {collapsed.group(1)}://{text[collapsed.end():]}")
    scheme = re.match(r"^([a-z][a-z0-9+.-]*)://", text)
    if scheme and not text.startswith(REMOTE_PREFIX):
        raise ValueError(f"{text!r}: a run directory is a local path or a gs://bucket/prefix URL, "
                         f"not {scheme.group(1)}://")
    if scheme:
        _require_gcs_client()
    return epath.Path(text)


def is_remote(path: PathLike) -> bool:
    """Whether `path` lives on the object store (gs://) rather than the local file system."""
    return os.fspath(path).startswith(REMOTE_PREFIX)


def _require_gcs_client() -> None:
    if importlib.util.find_spec("gcsfs") is None and importlib.util.find_spec("tensorflow") is None:
        raise ImportError("a gs:// run directory needs gcsfs: pip install 'intraskill-jax[gcs]' "
                          "(or gcsfs) on every worker")
    import fsspec.config

    # Checkpoint arrays reach the bucket through tensorstore, not gcsfs, so a directory listing that
    # gcsfs cached would miss them (and later steps); list afresh each time (runs list rarely).
    fsspec.config.conf.setdefault("gs", {}).setdefault("use_listings_cache", False)


def _bucket_key(path: PathLike) -> str:
    """The path without its scheme (how fsspec names objects in listings)."""
    return os.fspath(path).removeprefix(REMOTE_PREFIX).rstrip("/")


# -- where each record lives -----------------------------------------------------------------------


def config_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "config.json"


def metrics_path(workdir: PathLike) -> epath.Path:
    """`metrics.jsonl` of a run (or of the warm start, `sft_dir`)."""
    return run_path(workdir) / "metrics.jsonl"


def tensorboard_dir(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "tb"


def checkpoints_dir(workdir: PathLike) -> epath.Path:
    """orbax's directory of a run (or of the warm start, `sft_dir`)."""
    return run_path(workdir) / "checkpoints"


def base_policy_dir(workdir: PathLike) -> epath.Path:
    """The fresh starting policy (when `policy.path` names none)."""
    return run_path(workdir) / "base"


def sft_dir(workdir: PathLike) -> epath.Path:
    """The warm start's own run directory (its checkpoints, metrics and result)."""
    return run_path(workdir) / "sft"


def sft_policy_dir(workdir: PathLike) -> epath.Path:
    """The warm-started policy, where GRPO starts."""
    return sft_dir(workdir) / "hf"


def hf_weights_dir(workdir: PathLike, version: int) -> epath.Path:
    """The HF directory (safetensors, config, tokenizer) of weight version `version` that a
    rollout server loads (`update_weights_from_disk`)."""
    return run_path(workdir) / "hf" / f"weight_v{version:06d}"


def final_policy_dir(workdir: PathLike) -> epath.Path:
    """The trained policy (what evaluation loads); `final_record_path` says which step it is."""
    return run_path(workdir) / "hf" / "final"


def final_record_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "hf" / "final.json"


def skills_round_dir(workdir: PathLike, round_: int) -> epath.Path:
    """`skills/round_K/`: the bank of round K (a skill directory) and its `ledger.json`."""
    return run_path(workdir) / "skills" / f"round_{round_}"


def ledger_path(workdir: PathLike, round_: int) -> epath.Path:
    """Round K's ledger, the commit point of its bank (written after the skill files)."""
    return skills_round_dir(workdir, round_) / "ledger.json"


def latest_round(workdir: PathLike) -> int | None:
    """The highest K with a committed bank (`skills/round_K/ledger.json`); None if there is none."""
    rounds = [k for k, d in _numbered(run_path(workdir) / "skills", r"round_(\d+)").items()
              if (d / "ledger.json").is_file()]
    return max(rounds) if rounds else None


def rollouts_path(workdir: PathLike, step: int) -> epath.Path:
    return run_path(workdir) / "rollouts" / f"step_{step:06d}.jsonl"


def rollout_files(workdir: PathLike) -> dict[int, epath.Path]:
    """Step -> its episode file, for every step file in `rollouts/`."""
    return _numbered(run_path(workdir) / "rollouts", r"step_(\d+)\.jsonl")


def gate_path(workdir: PathLike, round_: int) -> epath.Path:
    return run_path(workdir) / "gates" / f"round_{round_}.json"


def gate_files(workdir: PathLike) -> dict[int, epath.Path]:
    """Round -> its gate record, for every gate record in `gates/`."""
    return _numbered(run_path(workdir) / "gates", r"round_(\d+)\.json")


def gate_episodes_path(workdir: PathLike, round_: int) -> epath.Path:
    return run_path(workdir) / "gates" / f"round_{round_}_episodes.jsonl"


def eval_outcomes_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "eval" / "outcomes.jsonl"


def eval_traces_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "eval" / "traces.jsonl"


def provenance_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "provenance.jsonl"


def ranking_outcomes_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "eval" / "ranking.jsonl"


def bundle_dir(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "bundle"


def report_dir(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "report"


def seed_run_dir(workdir: PathLike, seed: int) -> epath.Path:
    """One seed's run of `intraskill multiseed`; the pooled table is `multiseed_path`."""
    return run_path(workdir) / f"seed_{seed}"


def multiseed_path(workdir: PathLike) -> epath.Path:
    return run_path(workdir) / "multiseed.json"


def _numbered(root: epath.Path, pattern: str) -> dict[int, epath.Path]:
    """K -> entry, for the entries of `root` whose name matches `pattern` (one integer group), by K."""
    if not root.is_dir():
        return {}
    found = {}
    for entry in root.iterdir():
        m = re.fullmatch(pattern, entry.name)
        if m:
            found[int(m.group(1))] = root / entry.name
    return dict(sorted(found.items()))


# -- episode records -------------------------------------------------------------------------------


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


# -- one writer ------------------------------------------------------------------------------------


def _multiprocess() -> bool:
    # A command that never imported jax (report, check-bundle) is one process; don't import it.
    if "jax" not in sys.modules:
        return False
    from intraskill_jax import distributed

    return distributed.is_multiprocess()


def is_writer() -> bool:
    """Whether this process writes the run directory: process 0 of several, or the only one."""
    if not _multiprocess():
        return True
    from intraskill_jax import distributed

    return distributed.is_main_process()


# Set while a bracketed write runs: writes nested in it (the files of a directory `publish_dir`'s
# callback writes on process 0 alone) are part of the one write, not writes of their own.
_WRITING = contextvars.ContextVar("intraskill_rundir_writing", default=False)


@contextlib.contextmanager
def _one_writer(what: str, path: PathLike) -> Iterator[bool]:
    """Brackets a write of `path`: yields whether this process writes (process 0, or the only one).
    On several processes the write sits between a barrier named after it and an exchange of
    whether it failed, so a failure on process 0 raises on every process instead of leaving the
    others waiting."""
    if not _multiprocess() or _WRITING.get():
        yield True
        return
    from intraskill_jax import distributed

    distributed.sync(f"rundir {what} {path}: before")
    failure = None
    token = _WRITING.set(True)
    try:
        yield is_writer()
    except Exception as e:  # raised below, once every process knows
        failure = e
    finally:
        _WRITING.reset(token)
    failed = distributed.all_processes(failure is not None)
    if failure is not None:
        raise failure
    if any(failed):
        raise OSError(f"process {failed.index(True)} failed to {what} {path} (its log has the error)")


# -- writing and reading -----------------------------------------------------------------------------


def write_bytes(path: PathLike, data: bytes) -> epath.Path:
    """Writes one file whole: a reader sees the old content or the new, never part of it."""
    path = run_path(path)
    with _one_writer("write", path) as writes:
        if writes:
            _write_whole(path, data)
    return path


def _write_whole(path: epath.Path, data: bytes) -> None:
    if is_remote(path):
        path.write_bytes(data)  # a single object upload: it appears complete or not at all
        return
    local = Path(path)
    local.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=local.parent, prefix=f".{local.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, local)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: PathLike, text: str) -> epath.Path:
    """`write_bytes` of UTF-8 text."""
    return write_bytes(path, text.encode("utf-8"))


def write_json(path: PathLike, doc: Any) -> epath.Path:
    """Atomically writes one JSON document."""
    return write_text(path, json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


def jsonl_text(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(dict(r), ensure_ascii=False) + "\n" for r in rows)


def write_jsonl(path: PathLike, rows: Iterable[Mapping[str, Any]]) -> epath.Path:
    """Atomically writes JSON lines (the whole file at once)."""
    return write_text(path, jsonl_text(rows))


def read_json(path: PathLike) -> Any:
    return json.loads(run_path(path).read_text(encoding="utf-8"))


def read_jsonl(path: PathLike) -> list[dict[str, Any]]:
    path = run_path(path)
    rows = []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: line {i + 1} is not JSON ({e.msg})") from None
    return rows


class JsonlLog:
    """An append-only JSON-lines file (`metrics.jsonl`).

    Locally each row is appended and flushed (a kill can tear only the last line; readers skip it).
    An object cannot be appended to, so on an object store the file is kept in memory and uploaded
    whole after each row: one atomic object write per row, which at a few rows per step costs little
    next to the step. On several processes only process 0 opens it.
    """

    def __init__(self, path: PathLike):
        self.path = run_path(path)
        self._remote = is_remote(self.path)
        self._text = ""
        self._file = None
        with _one_writer("open", self.path) as writes:
            if not writes:
                return
            if self._remote:
                if self.path.exists():
                    self._text = self.path.read_text(encoding="utf-8")
            else:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                self._file = open(self.path, "a", encoding="utf-8")

    def append(self, row: Mapping[str, Any]) -> None:
        line = jsonl_text([row])
        with _one_writer("append", self.path) as writes:
            if not writes:
                return
            if self._remote:
                self._text += line
                _write_whole(self.path, self._text.encode("utf-8"))
            else:
                self._file.write(line)
                self._file.flush()

    def rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Replaces the whole file with `rows`, atomically."""
        text = jsonl_text(rows)
        with _one_writer("rewrite", self.path) as writes:
            if not writes:
                return
            if self._remote:
                self._text = text
            else:
                self._file.close()
            _write_whole(self.path, text.encode("utf-8"))
            if not self._remote:
                self._file = open(self.path, "a", encoding="utf-8")

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def list_files(root: PathLike) -> list[str]:
    """Every file under `root`, as sorted POSIX paths relative to it ([] when it does not exist)."""
    root = run_path(root)
    base = _bucket_key(root)
    out = []
    for dirpath, _, files in root.walk():
        rel = posixpath.relpath(_bucket_key(dirpath), base)
        out += [posixpath.normpath(posixpath.join(rel, name)) for name in files]
    return sorted(out)


def remove(path: PathLike) -> None:
    """Deletes a file or a directory tree of the run, if it exists."""
    path = run_path(path)
    with _one_writer("remove", path) as writes:
        if writes and path.is_dir():
            path.rmtree()
        elif writes and path.exists():
            path.unlink()


def _copy_file(src: PathLike, dst: PathLike) -> None:
    """Streams one file between the stores (each object is written in one upload)."""
    src, dst = epath.Path(src), epath.Path(dst)
    if not is_remote(dst):
        Path(dst).parent.mkdir(parents=True, exist_ok=True)
    with src.open("rb") as fin, dst.open("wb") as fout:
        shutil.copyfileobj(fin, fout, _COPY_CHUNK)


def publish_dir(out: PathLike, write: Callable[[Path], Any], *, commit_file: str = COMMIT_MARKER) -> epath.Path:
    """Writes a directory that readers see whole or not at all (an HF export, the bundle).

    `write(tmp)` fills a local directory `tmp`; a file named `commit_file` is added unless `write`
    made one (the bundle's manifest is its commit file). Locally `tmp` is `<out>.tmp`, renamed into
    place (an old `out` is moved aside first and deleted after); on an object store `tmp` is a local
    temporary directory whose files are uploaded over a cleared `out`, `commit_file` last. Until
    `write` returns, an old `out` is untouched. On several processes only process 0 calls `write`,
    so it must run no collective; its own rundir writes are part of this one. Returns `out`.
    """
    out = run_path(out)
    with _one_writer("publish", out) as writes:
        if writes:
            _publish(out, write, commit_file)
    return out


def _publish(out: epath.Path, write: Callable[[Path], Any], commit_file: str) -> None:
    if not is_remote(out):
        tmp, old = Path(f"{out}.tmp"), Path(f"{out}.old")
        for stale in (tmp, old):
            if stale.exists():
                shutil.rmtree(stale)
        tmp.mkdir(parents=True)
        write(tmp)
        _add_commit_file(tmp, commit_file)
        reached("dir_written")
        if Path(out).exists():
            os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
        return
    with tempfile.TemporaryDirectory(prefix="intraskill-publish-") as tmp:
        write(Path(tmp))
        _add_commit_file(Path(tmp), commit_file)
        if out.exists():  # the old version, or an unfinished upload (no commit file)
            out.rmtree()
        for rel in sorted(list_files(tmp), key=lambda rel: rel == commit_file):
            if rel == commit_file:
                reached("dir_written")
            _copy_file(Path(tmp) / rel, out / rel)


def publish_policy(out: PathLike, model: Any, tokenizer: Any, *, hf_config: Mapping[str, Any] | None = None) -> epath.Path:
    """Publishes `model` and `tokenizer` as the HF directory `out` (every policy a run writes).
    On several processes every process calls it: the sharded parameters are gathered to the host
    everywhere (a collective), then process 0 writes them."""
    from intraskill_jax.models.params import save_pretrained

    if _multiprocess():
        from flax import nnx

        from intraskill_jax import distributed

        graphdef, state = nnx.split(model)
        model = nnx.merge(graphdef, distributed.gather_to_host(state))
    return publish_dir(out, lambda tmp: (save_pretrained(model, tmp, hf_config=hf_config), tokenizer.save_pretrained(tmp)))


def _add_commit_file(directory: Path, commit_file: str) -> None:
    marker = directory / commit_file
    if not marker.exists():
        marker.write_text("", encoding="utf-8")


def is_published(path: PathLike, *, commit_file: str = COMMIT_MARKER) -> bool:
    """Whether the directory `publish_dir` wrote at `path` is complete: on an object store its
    commit file is there; locally it exists under its name (the rename was its commit)."""
    path = run_path(path)
    return (path / commit_file).is_file() if is_remote(path) else path.is_dir()


@contextlib.contextmanager
def local_dir(path: PathLike, *, skip: Sequence[str] = ()) -> Iterator[Path]:
    """The files of directory `path` in a local directory, for readers of local files only (the HF
    tokenizer, the memory-mapped safetensors reader): `path` itself when it is local, else a
    temporary download, deleted on exit. `skip`: glob patterns of files not to download."""
    path = run_path(path)
    if not is_remote(path):
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="intraskill-stage-") as tmp:
        for rel in list_files(path):
            if not any(fnmatch.fnmatch(rel, pattern) for pattern in skip):
                _copy_file(path / rel, Path(tmp) / rel)
        yield Path(tmp)


# -- crash points (a test hook) --------------------------------------------------------------------

KILL_AT_ENV = "INTRASKILL_KILL_AT"
PHASES = (
    "step_rollouts",  # a step's episodes are written; its update, weight push and checkpoint are not
    "checkpoint_commit",  # a checkpoint's write has started and is not committed
    "gate_recorded",  # a gate's record and metrics are written; the next bank is not
    "bank_committed",  # the next bank is committed; nothing after it (the next metrics) is written
    "dir_written",  # a published directory's files are written (locally under <out>.tmp, on an object
    #                 store uploaded) and its commit (the rename, or the commit file) is not
    "eval_recorded",  # the evaluation's outcomes are written; its example traces are not
)
_reached: collections.Counter[str] = collections.Counter()


def reached(phase: str) -> None:
    """Marks a point of a run where a crash must be survivable.

    A test hook: with `INTRASKILL_KILL_AT=<phase>:<n>` in the environment the process SIGKILLs
    itself the n-th time (default 1) it reaches `phase`, so a test can crash a run exactly there
    and check that the resumed run ends as an uninterrupted one. Without it this does nothing.
    """
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}; known: {PHASES}")
    spec = os.environ.get(KILL_AT_ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name not in PHASES or not (count or "1").isdigit():
        raise ValueError(f"{KILL_AT_ENV}={spec!r}: expected <phase>[:<n>] with a phase of {PHASES}")
    if name != phase:
        return
    _reached[phase] += 1
    if _reached[phase] == int(count or 1):
        log.warning("%s=%s: killing this process at phase %s (time %d)", KILL_AT_ENV, spec, phase, _reached[phase])
        logging.shutdown()
        os.kill(os.getpid(), signal.SIGKILL)
