"""The skill bank: small text chunks in English and Chinese, versioned by round, with a ledger.

On disk a bank is an Agent Skills directory whose name equals its `name` (kebab-case):

    <name>/SKILL.md            front matter (name, description, metadata.round) + a chunk index
    <name>/chunks/<id>.md      front matter (id, title, status, revision) + "## en" and "## zh"

Contribution estimates and decisions never go into these files: each round's `ledger.json` sits
beside the skill directory (`<workdir>/skills/round_K/{sK/, ledger.json}`), so the text a policy
reads stays free of statistics and the ledger can be audited on its own.

Rendering follows one rule that the regression relies on: an empty mask renders "" (so the prompt
is byte-identical to the bare one), and the header appears only when at least one chunk is on.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import yaml
from etils import epath

from intraskill_jax import rundir
from intraskill_jax.rundir import json_finite
from intraskill_jax.tokenization import CONTROL_MARKUP

Status = Literal["active", "retired"]
Action = Literal["retain", "rewrite", "add", "retire"]
LANGS = ("en", "zh")
ACTIONS = ("retain", "rewrite", "add", "retire")

_NAME = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_SECTION = re.compile(r"^## (en|zh)[ \t]*$", re.MULTILINE)
_FRONT = re.compile(r"\A---\n(.*?)\n---\n", re.DOTALL)
_SKILL_KEYS = {"name", "description", "license", "allowed-tools", "metadata", "compatibility"}

HEADERS = {
    "en": "Shopping skill (procedures that often help in this shop):",
    "zh": "购物技能（在本店购物时常用的操作步骤）：",
}


class BankFormatError(ValueError):
    """A skill directory or ledger that does not follow the format above."""


@dataclasses.dataclass(frozen=True)
class Chunk:
    """One scene-level procedure. `id` is stable across rewrites; `revision` counts them."""

    id: str
    en: str
    zh: str
    title: str = ""
    status: Status = "active"
    revision: int = 0

    def __post_init__(self) -> None:
        if not _NAME.match(self.id) or len(self.id) > 64:
            raise BankFormatError(
                f"chunk id {self.id!r} must be kebab-case (a-z, 0-9, '-'), at most 64 chars"
            )
        if self.status not in ("active", "retired"):
            raise BankFormatError(
                f"chunk {self.id}: status must be 'active' or 'retired', got {self.status!r}"
            )
        for lang in LANGS:
            text = self.text(lang)
            if not text.strip():
                raise BankFormatError(f"chunk {self.id}: empty {lang} text")
            if CONTROL_MARKUP.search(text):
                raise BankFormatError(
                    f"chunk {self.id}: {lang} text contains chat/tool markup; remove it"
                )

    def text(self, lang: str) -> str:
        if lang not in LANGS:
            raise ValueError(f"lang must be one of {LANGS}, got {lang!r}")
        return self.en if lang == "en" else self.zh


@dataclasses.dataclass(frozen=True)
class LedgerEntry:
    """One change between round K-1 and round K, with the evidence behind it.

    `estimate` holds the gate's fit for the column that decided it (beta, se, ci_low, ci_high,
    p, and p_adjusted when BH was on); `trajectory_ids` and `source` say where a proposal came from.
    """

    chunk_id: str
    action: Action
    reason: str
    estimate: Mapping[str, float] | None = None
    trajectory_ids: tuple[str, ...] = ()
    source: str = ""
    proposal_id: str | None = None
    previous_text: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise BankFormatError(f"ledger action must be one of {ACTIONS}, got {self.action!r}")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["trajectory_ids"] = list(self.trajectory_ids)
        d["estimate"] = dict(self.estimate) if self.estimate is not None else None
        d["previous_text"] = dict(self.previous_text) if self.previous_text is not None else None
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> LedgerEntry:
        try:
            return cls(
                chunk_id=d["chunk_id"],
                action=d["action"],
                reason=d["reason"],
                estimate=d.get("estimate"),
                trajectory_ids=tuple(d.get("trajectory_ids", ())),
                source=d.get("source", ""),
                proposal_id=d.get("proposal_id"),
                previous_text=d.get("previous_text"),
            )
        except KeyError as e:
            raise BankFormatError(f"ledger entry {dict(d)!r} lacks {e}") from None


@dataclasses.dataclass(frozen=True)
class Proposal:
    """A candidate change to the bank, tested by the next gate as its own mask column.

    `op` is 'add' (a new chunk whose id is `id`) or 'rewrite' (new text for chunk `target`).
    `trajectory_ids` are the episodes whose analysis supports it; `source` names the analyst.
    """

    id: str
    op: Literal["add", "rewrite"]
    en: str
    zh: str
    title: str = ""
    target: str | None = None
    trajectory_ids: tuple[str, ...] = ()
    source: str = ""
    rationale: str = ""

    def __post_init__(self) -> None:
        if self.op not in ("add", "rewrite"):
            raise ValueError(f"proposal op must be 'add' or 'rewrite', got {self.op!r}")
        if (self.op == "rewrite") != (self.target is not None):
            raise ValueError(
                f"proposal {self.id}: a rewrite needs a target chunk and an add must not have one"
            )

    def text(self, lang: str) -> str:
        return self.en if lang == "en" else self.zh

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["trajectory_ids"] = list(self.trajectory_ids)
        return d


def render_texts(texts: Sequence[str], lang: str) -> str:
    """The prompt block for the chunks that are on: "" for none, else the header and one item each."""
    if not texts:
        return ""
    return HEADERS[lang] + "\n" + "\n".join(f"- {t.strip()}" for t in texts)


@dataclasses.dataclass(frozen=True)
class SkillBank:
    """A bank version: the chunks (active and retired, in order), its round and that round's ledger.

    Masks index `active` chunks in bank order; `active_ids` names the columns.
    """

    name: str
    description: str
    chunks: tuple[Chunk, ...]
    round: int = 0
    ledger: tuple[LedgerEntry, ...] = ()
    ledger_extra: Mapping[str, Any] = dataclasses.field(
        default_factory=dict
    )  # fit summary, additivity

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or len(self.name) > 64:
            raise BankFormatError(
                f"skill name {self.name!r} must be kebab-case (a-z, 0-9, '-'), at most 64 chars"
            )
        if (
            not 1 <= len(self.description) <= 1024
            or "<" in self.description
            or ">" in self.description
        ):
            raise BankFormatError("skill description must be 1-1024 characters without '<' or '>'")
        ids = [c.id for c in self.chunks]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise BankFormatError(f"skill {self.name}: duplicate chunk ids {dupes}")
        if self.round < 0:
            raise BankFormatError(f"round must be >= 0, got {self.round}")

    @property
    def active(self) -> tuple[Chunk, ...]:
        return tuple(c for c in self.chunks if c.status == "active")

    @property
    def active_ids(self) -> tuple[str, ...]:
        return tuple(c.id for c in self.active)

    def chunk(self, chunk_id: str) -> Chunk:
        for c in self.chunks:
            if c.id == chunk_id:
                return c
        raise KeyError(f"no chunk {chunk_id!r} in skill {self.name} (round {self.round})")

    def render(self, mask: Sequence[int] | Sequence[bool], lang: str) -> str:
        """The skill text for a mask over `active` chunks; an all-zero mask gives ""."""
        active = self.active
        if len(mask) != len(active):
            raise ValueError(
                f"mask has {len(mask)} entries for {len(active)} active chunks of {self.name}"
            )
        return render_texts([c.text(lang) for c, on in zip(active, mask) if on], lang)

    def full_mask(self) -> tuple[int, ...]:
        return (1,) * len(self.active)

    def estimates(self) -> dict[str, Mapping[str, float]]:
        """The latest estimate per chunk id, from this round's ledger (empty before the first gate)."""
        return {
            e.chunk_id: e.estimate
            for e in self.ledger
            if e.estimate is not None and e.action != "retire"
        }

    # -- I/O ---------------------------------------------------------------------------------

    @classmethod
    def load(cls, skill_dir: rundir.PathLike, ledger_path: rundir.PathLike | None = None) -> SkillBank:
        """Reads a skill directory (and optionally a round ledger); raises BankFormatError naming the problem."""
        skill_dir = rundir.run_path(skill_dir)
        md = skill_dir / "SKILL.md"
        if not md.is_file():
            raise BankFormatError(f"{md} not found: a skill directory needs a SKILL.md")
        front, _ = _split_front(md.read_text(encoding="utf-8"), md)
        unknown = set(front) - _SKILL_KEYS
        if unknown:
            raise BankFormatError(
                f"{md}: unknown front-matter keys {sorted(unknown)}; allowed {sorted(_SKILL_KEYS)}"
            )
        name = front.get("name")
        if name != skill_dir.name:
            raise BankFormatError(
                f"{md}: name {name!r} must equal the directory name {skill_dir.name!r}"
            )
        metadata = front.get("metadata") or {}
        try:
            round_ = int(metadata.get("round", 0))
            order = [s for s in str(metadata.get("chunks", "")).split() if s]
        except (TypeError, ValueError, AttributeError):
            raise BankFormatError(
                f"{md}: metadata must map 'round' to an integer and 'chunks' to ids"
            ) from None
        files = {p.stem: p for p in sorted((skill_dir / "chunks").glob("*.md"))}
        missing = [i for i in order if i not in files]
        if missing:
            raise BankFormatError(
                f"{md}: metadata.chunks lists {missing} with no file under chunks/"
            )
        order += [i for i in files if i not in order]
        chunks = tuple(_read_chunk(files[i]) for i in order)
        ledger: tuple[LedgerEntry, ...] = ()
        extra: dict[str, Any] = {}
        if ledger_path is not None:
            ledger, extra, ledger_round = read_ledger(ledger_path)
            if ledger_round != round_:
                raise BankFormatError(
                    f"{ledger_path} is for round {ledger_round}, the skill for round {round_}"
                )
        return cls(
            name=name,
            description=str(front.get("description", "")),
            chunks=chunks,
            round=round_,
            ledger=ledger,
            ledger_extra=extra,
        )

    def save(self, skill_dir: rundir.PathLike) -> epath.Path:
        """Writes the skill directory (named after the bank); stale chunk files are removed."""
        skill_dir = rundir.run_path(skill_dir)
        if skill_dir.name != self.name:
            raise BankFormatError(
                f"skill {self.name} must be saved in a directory named {self.name}, not {skill_dir}"
            )
        keep = {f"{c.id}.md" for c in self.chunks}
        if (skill_dir / "chunks").is_dir():
            for p in sorted((skill_dir / "chunks").glob("*.md")):  # sorted: every process in one order
                if p.name not in keep:
                    rundir.remove(p)
        for c in self.chunks:
            rundir.write_text(skill_dir / "chunks" / f"{c.id}.md", _chunk_markdown(c))
        rundir.write_text(skill_dir / "SKILL.md", self._skill_markdown())
        return skill_dir

    def _skill_markdown(self) -> str:
        front = {
            "name": self.name,
            "description": self.description,
            "metadata": {"round": str(self.round), "chunks": " ".join(c.id for c in self.chunks)},
        }
        lines = [
            "---",
            yaml.safe_dump(front, allow_unicode=True, sort_keys=False, width=100).rstrip(),
            "---",
            "",
            "# Shopping procedures",
            "",
            "Scene-level chunks, one file each under `chunks/`, each in English and Chinese. During",
            "training every chunk is switched on or off independently, so each one stands alone.",
            "Contribution estimates and decisions live in the round ledger, never here.",
            "",
            "## Chunks",
            "",
        ]
        lines += [f"- [{c.id}](chunks/{c.id}.md): {c.title}" for c in self.active]
        retired = [c for c in self.chunks if c.status == "retired"]
        if retired:
            lines += ["", "## Retired (kept for the record, never rendered)", ""]
            lines += [f"- [{c.id}](chunks/{c.id}.md): {c.title}" for c in retired]
        return "\n".join(lines) + "\n"

    def save_round(self, workdir: rundir.PathLike) -> epath.Path:
        """Writes `<workdir>/skills/round_K/` with the skill directory, then `ledger.json`, the
        round's commit point (a reader never takes a round without its ledger); returns it."""
        round_dir = rundir.skills_round_dir(workdir, self.round)
        self.save(round_dir / self.name)
        write_ledger(
            rundir.ledger_path(workdir, self.round), self.round, self.name, self.ledger, self.ledger_extra
        )
        return round_dir

    @classmethod
    def load_round(cls, workdir: rundir.PathLike, round_: int) -> SkillBank:
        round_dir = rundir.skills_round_dir(workdir, round_)
        ledger = rundir.ledger_path(workdir, round_)
        if not ledger.is_file():
            raise BankFormatError(
                f"{ledger} not found: round {round_} was never written under {workdir}"
            )
        name = json.loads(ledger.read_text(encoding="utf-8")).get("skill")
        if not isinstance(name, str):
            raise BankFormatError(f"{ledger}: missing the 'skill' directory name")
        return cls.load(round_dir / name, ledger)

    def next_version(
        self,
        chunks: Iterable[Chunk],
        ledger: Iterable[LedgerEntry],
        extra: Mapping[str, Any] | None = None,
    ) -> SkillBank:
        """The bank of the following round (named s<K+1>), carrying that round's ledger."""
        r = self.round + 1
        return dataclasses.replace(
            self,
            name=f"s{r}",
            chunks=tuple(chunks),
            round=r,
            ledger=tuple(ledger),
            ledger_extra=dict(extra or {}),
        )


def write_ledger(
    path: rundir.PathLike,
    round_: int,
    skill: str,
    entries: Iterable[LedgerEntry],
    extra: Mapping[str, Any] | None = None,
) -> None:
    doc = json_finite({
        "round": round_,
        "skill": skill,
        "entries": [e.to_json() for e in entries],
        **dict(extra or {}),
    })
    # Whole or not at all: a reader never sees half a ledger.
    rundir.write_text(path, json.dumps(doc, ensure_ascii=False, indent=1, allow_nan=False) + "\n")


def read_ledger(path: rundir.PathLike) -> tuple[tuple[LedgerEntry, ...], dict[str, Any], int]:
    path = rundir.run_path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise BankFormatError(f"cannot read ledger {path}: {e}") from None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("entries"), list)
        or not isinstance(doc.get("round"), int)
    ):
        raise BankFormatError(
            f"{path}: a ledger is an object with an integer 'round' and a list 'entries'"
        )
    extra = {k: v for k, v in doc.items() if k not in ("round", "skill", "entries")}
    return tuple(LedgerEntry.from_json(e) for e in doc["entries"]), extra, doc["round"]


def _split_front(text: str, path: epath.Path) -> tuple[dict[str, Any], str]:
    m = _FRONT.match(text)
    if not m:
        raise BankFormatError(f"{path}: expected YAML front matter between '---' lines at the top")
    try:
        front = yaml.safe_load(m.group(1))
    except yaml.YAMLError as e:
        raise BankFormatError(f"{path}: front matter is not valid YAML: {e}") from None
    if not isinstance(front, dict):
        raise BankFormatError(f"{path}: front matter must be a mapping")
    return front, text[m.end() :]


def _read_chunk(path: epath.Path) -> Chunk:
    front, body = _split_front(path.read_text(encoding="utf-8"), path)
    if front.get("id") != path.stem:
        raise BankFormatError(
            f"{path}: id {front.get('id')!r} must equal the file name {path.stem!r}"
        )
    parts = _SECTION.split(body)
    # split gives [preamble, lang, text, lang, text, ...]
    texts: dict[str, str] = {}
    for lang, text in zip(parts[1::2], parts[2::2]):
        if lang in texts:
            raise BankFormatError(f"{path}: section '## {lang}' appears twice")
        texts[lang] = text.strip()
    missing = [lang for lang in LANGS if lang not in texts]
    if missing:
        raise BankFormatError(f"{path}: missing section(s) {', '.join('## ' + m for m in missing)}")
    try:
        return Chunk(
            id=front["id"],
            en=texts["en"],
            zh=texts["zh"],
            title=str(front.get("title", "")),
            status=front.get("status", "active"),
            revision=int(front.get("revision", 0)),
        )
    except BankFormatError as e:
        raise BankFormatError(f"{path}: {e}") from None
    except (TypeError, ValueError):
        raise BankFormatError(f"{path}: revision must be an integer") from None


def _chunk_markdown(c: Chunk) -> str:
    front = yaml.safe_dump(
        {"id": c.id, "title": c.title, "status": c.status, "revision": c.revision},
        allow_unicode=True,
        sort_keys=False,
        width=1000,
    )
    return f"---\n{front}---\n\n## en\n\n{c.en}\n\n## zh\n\n{c.zh}\n"
