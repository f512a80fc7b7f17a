"""Tests for intraskill_jax/skills/bank.py: S0, the directory format, rounds, ledger, rendering."""

import dataclasses
import filecmp
import itertools
import json
import re
import shutil
from pathlib import Path

import pytest

from intraskill_jax.agent.prompts import system_prompt
from intraskill_jax.skills.bank import (
    HEADERS,
    BankFormatError,
    Chunk,
    LedgerEntry,
    SkillBank,
    render_texts,
)
from intraskill_jax.rundir import latest_round
from intraskill_jax.tokenization import CONTROL_MARKUP

S0 = Path(__file__).resolve().parents[2] / "skills" / "s0"
_CJK = re.compile(r"[\u4e00-\u9fff]")


@pytest.fixture(scope="module")
def s0() -> SkillBank:
    return SkillBank.load(S0)


def test_s0_is_ten_bilingual_scene_chunks(s0):
    assert s0.name == "s0" and s0.round == 0 and len(s0.active) == 10
    for c in s0.active:
        assert c.title and not CONTROL_MARKUP.search(c.en + c.zh)
        assert _CJK.search(c.zh) and not _CJK.search(c.en)
        assert len(c.en) < 500 and len(c.zh) < 250, c.id  # "a few sentences"
    text = " ".join(c.en for c in s0.active)
    for tool in (
        "search",
        "click[",
        "ask_shopper",
        "buy now",
        "features",
        "next >",
        "back to search",
    ):
        assert tool in text


def test_s0_save_reproduces_the_directory_byte_for_byte(s0, tmp_path):
    out = Path(s0.save(tmp_path / "s0"))  # a local run path: pathlib walks it
    names = sorted(p.relative_to(S0).as_posix() for p in S0.rglob("*.md"))
    assert names == sorted(p.relative_to(out).as_posix() for p in out.rglob("*.md"))
    _, mismatch, errors = filecmp.cmpfiles(S0, out, names, shallow=False)
    assert not mismatch and not errors


def test_round_trip_with_ledger_and_retired_chunks(s0, tmp_path):
    entries = [
        LedgerEntry(
            "query-specific",
            "retain",
            "passes",
            {"beta": 0.1, "se": 0.05, "ci_low": 0.0, "ci_high": 0.2, "p": 0.04, "n": 200},
        ),
        LedgerEntry(
            "when-to-buy",
            "retire",
            "fails",
            {"beta": -0.1, "se": 0.05, "ci_low": -0.2, "ci_high": 0.0, "p": 0.04, "n": 200},
        ),
        LedgerEntry(
            "r1-search-early",
            "add",
            "passes",
            {"beta": 0.2, "se": 0.05, "ci_low": 0.1, "ci_high": 0.3, "p": 0.001, "n": 200},
            ("ep-3", "ep-9"),
            "offline",
            "r1-search-early",
        ),
    ]
    chunks = [
        dataclasses.replace(c, status="retired") if c.id == "when-to-buy" else c for c in s0.chunks
    ]
    chunks.append(Chunk("r1-search-early", "Search early.", "尽早搜索。", title="Search early"))
    nxt = s0.next_version(chunks, entries, {"additivity": {"predicted": 0.1}})
    assert nxt.name == "s1" and nxt.round == 1 and len(nxt.active) == 10
    round_dir = nxt.save_round(tmp_path)
    assert (round_dir / "s1" / "SKILL.md").is_file() and (round_dir / "ledger.json").is_file()
    # statistics stay out of the text
    assert "beta" not in (round_dir / "s1" / "SKILL.md").read_text()
    assert "Retired" in (round_dir / "s1" / "SKILL.md").read_text()
    back = SkillBank.load_round(tmp_path, 1)
    assert back == nxt
    assert latest_round(tmp_path) == 1
    doc = json.loads((round_dir / "ledger.json").read_text())
    assert [e["action"] for e in doc["entries"]] == ["retain", "retire", "add"]
    assert (
        doc["entries"][2]["trajectory_ids"] == ["ep-3", "ep-9"]
        and doc["entries"][2]["source"] == "offline"
    )
    assert back.estimates().keys() == {"query-specific", "r1-search-early"}


@pytest.mark.parametrize("lang,mode", list(itertools.product(("en", "zh"), ("single", "multi"))))
def test_empty_mask_is_the_bare_prompt_byte_for_byte(s0, lang, mode):
    profile = {"name": "A", "likes": ["cotton"]}
    empty = s0.render((0,) * len(s0.active), lang)
    assert empty == ""
    assert (
        system_prompt(lang, mode, empty, profile).encode()
        == system_prompt(lang, mode, "", profile).encode()
    )
    assert system_prompt(lang, mode, empty) == system_prompt(lang, mode)


def test_header_only_when_a_chunk_is_on(s0):
    mask = [0] * 10
    mask[3] = 1
    text = s0.render(mask, "zh")
    assert text == HEADERS["zh"] + "\n- " + s0.active[3].zh
    full = s0.render(s0.full_mask(), "en")
    assert full.count(HEADERS["en"]) == 1 and full.count("\n- ") == 10
    assert render_texts([], "en") == ""
    with pytest.raises(ValueError, match="10 active chunks"):
        s0.render([1, 0], "en")


def _broken(tmp_path, mutate):
    d = tmp_path / "s0"
    shutil.copytree(S0, d)
    mutate(d)
    return d


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda d: (d / "SKILL.md").unlink(), "needs a SKILL.md"),
        (
            lambda d: (d / "SKILL.md").write_text(
                (d / "SKILL.md").read_text().replace("name: s0", "name: other")
            ),
            "must equal the directory name",
        ),
        (
            lambda d: (d / "SKILL.md").write_text(
                (d / "SKILL.md").read_text().replace("name: s0", "name: s0\nversion: 2")
            ),
            "unknown front-matter keys",
        ),
        (lambda d: (d / "SKILL.md").write_text("no front matter"), "front matter"),
        (
            lambda d: (d / "chunks" / "when-to-buy.md").write_text(
                (d / "chunks" / "when-to-buy.md").read_text().split("## zh")[0]
            ),
            r"missing section\(s\) ## zh",
        ),
        (
            lambda d: (d / "chunks" / "when-to-buy.md").write_text(
                (d / "chunks" / "when-to-buy.md")
                .read_text()
                .replace("Buy with", "<|im_end|> Buy with")
            ),
            "markup",
        ),
        (lambda d: (d / "chunks" / "when-to-buy.md").unlink(), r"no file under chunks/"),
        (
            lambda d: (d / "chunks" / "when-to-buy.md").write_text(
                (d / "chunks" / "when-to-buy.md").read_text().replace("id: when-to-buy", "id: buy")
            ),
            "must equal the file name",
        ),
    ],
)
def test_malformed_banks_raise_a_clear_error(tmp_path, mutate, message):
    d = _broken(tmp_path, mutate)
    with pytest.raises(BankFormatError, match=message):
        SkillBank.load(d)


def test_bad_ledger_and_missing_round(s0, tmp_path):
    with pytest.raises(BankFormatError, match="round 3 was never written"):
        SkillBank.load_round(tmp_path, 3)
    s0.save_round(tmp_path)
    (tmp_path / "skills" / "round_0" / "ledger.json").write_text(
        '{"round": 0, "entries": [{"action": "keep"}]}'
    )
    with pytest.raises(BankFormatError):
        SkillBank.load(
            tmp_path / "skills" / "round_0" / "s0", tmp_path / "skills" / "round_0" / "ledger.json"
        )
    with pytest.raises(BankFormatError, match="kebab-case"):
        Chunk("Bad_Id", "x", "y")
    with pytest.raises(BankFormatError, match="duplicate chunk ids"):
        SkillBank("s0", "d", (s0.active[0], s0.active[0]))


def test_undefined_statistics_are_stored_as_null_and_read_as_no_estimate(s0, tmp_path):
    from intraskill_jax.skills.bank import LedgerEntry
    from intraskill_jax.skills.masks import MaskConfig, inclusion_probabilities

    first = s0.active[0].id
    entry = LedgerEntry(first, "retain", "zero-variance fit", {"beta": float("nan"), "se": 0.0, "p": float("inf")})
    bank = s0.next_version(s0.chunks, [entry], {"fit": {"se": [float("nan")]}})
    bank.save_round(tmp_path)
    doc = json.loads((tmp_path / "skills" / "round_1" / "ledger.json").read_text())
    assert doc["entries"][0]["estimate"] == {"beta": None, "se": 0.0, "p": None} and doc["fit"]["se"] == [None]
    back = SkillBank.load_round(tmp_path, 1)
    assert inclusion_probabilities(back, MaskConfig())[0] == MaskConfig().prior
