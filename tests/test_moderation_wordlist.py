"""The word list: one normal form on both sides, so spelling tricks hide no term."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from service.content import CONTENT_DIR
from service.moderation.normalise import normalise
from service.moderation.wordlist import (
    WatchedList,
    WordList,
    WordListError,
    list_path,
    read_terms,
)

from .test_content import _start, own_copy

LISTED = WordList(["禁词", "jin", "forbidden thing"])


@pytest.mark.parametrize(
    "prompt",
    [
        "禁词",
        "一张禁 词的图",  # spaced
        "禁-词",  # punctuated
        "禁。词！",  # CJK punctuation
        "禁\u200b词",  # zero-width space
        "禁\u200d\ufeff词",  # zero-width joiner, byte-order mark
        "禁詞",  # traditional
        "ＪＩＮ",  # full-width
        "a JiN portrait",  # mixed case
        "j i n",
        "J.I.N.",
        "Ｊ\u200bｉ\u3000Ｎ",  # full-width, zero-width, ideographic space
        "FORBIDDEN—THING",
        "forbidden ★ thing",  # a symbol in between
        "ﬁ forbidden\tthing",
        "禁\ufe0f词",  # a variation selector (Mn)
        "禁\U000e0100词",  # a supplementary variation selector
        "j\u034fin",  # the combining grapheme joiner
        "j\u17b4in",  # a Khmer inherent vowel, invisible
        "j\u0336i\u0336n\u0336",  # struck through, one combining stroke a letter
        "禁\u20dd词",  # an enclosing circle (Me)
        "j\u3164in",  # the Hangul filler, an invisible letter
        "j\uffa0in",  # its half-width form
    ],
)
def test_evasion_variants_of_a_listed_term_are_refused(prompt: str) -> None:
    """Spaced, punctuated, full-width, traditional, mixed case, zero-width: one term."""
    assert LISTED.match(prompt) is not None


@pytest.mark.parametrize(
    "prompt", ["a quiet lake at dawn", "禁止吸烟的标志", "词典", "jade inn"]
)
def test_innocent_prompts_pass(prompt: str) -> None:
    """Neither half of a term alone, nor its letters out of order, is a match."""
    assert LISTED.match(prompt) is None


def test_letters_across_a_word_boundary_are_a_documented_limit() -> None:
    """Removing spaces joins words: "Beijing inn" reads "beijinginn", holding "jin".

    Chinese has no spaces at all, so "特色情调" (a distinctive mood) holds
    "色情". docs/operating.md states this limit; this test keeps it true.
    """
    assert LISTED.match("Beijing inn") is not None
    assert WordList(["色情"]).match("特色情调的咖啡馆") is not None


def test_the_match_names_the_term_as_the_operator_wrote_it() -> None:
    """The log shows the listed line, not its normal form."""
    found = LISTED.match("FORBIDDEN THING")
    assert found is not None
    assert found.term == "forbidden thing"


def test_normalising_folds_width_case_script_and_drops_separators() -> None:
    """NFKC, case fold, t2s, and no space, punctuation, symbol or format character."""
    assert normalise("Ｈｅｌｌｏ， 世界！ 學習\u200b★") == "hello世界学习"
    # a letter and its combining accent are one letter once composed
    assert normalise("cafe\u0301 Café") == "cafécafé"


def test_an_empty_list_matches_nothing() -> None:
    """No file (an operator's content without one): nothing is blocked."""
    assert WordList([]).match("anything at all") is None
    assert WordList(["  ", "---"]).match("---") is None  # terms that normalise to ""


def test_the_packaged_list_blocks_its_examples(tmp_path: Path) -> None:
    """The shipped example list loads, skips comments, and blocks its terms."""
    terms = read_terms(list_path(CONTENT_DIR))
    assert terms
    assert not any(term.startswith("#") for term in terms)
    words = WordList(terms)
    assert words.match("兒童 色情") is not None
    assert words.match("a cat on a sofa") is None


def test_comments_and_blank_lines_are_not_terms(tmp_path: Path) -> None:
    """`#` starts a comment anywhere on a line."""
    path = tmp_path / "blocked.txt"
    path.write_text("# heading\n\nalpha  # why\n   \nbeta\n", encoding="utf-8")
    assert read_terms(path) == ["alpha", "beta"]


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    """A list saved in GBK stops start-up with the file named."""
    path = tmp_path / "blocked.txt"
    path.write_bytes("禁词".encode("gbk"))
    with pytest.raises(WordListError, match="not UTF-8"):
        read_terms(path)


async def test_a_changed_file_is_in_force_without_a_restart(tmp_path: Path) -> None:
    """The watcher rebuilds the automaton when the file changes; a bad file keeps it."""
    path = tmp_path / "blocked.txt"
    path.write_text("alpha\n", encoding="utf-8")
    watched = WatchedList(path)
    watcher = asyncio.create_task(watched.watch(0.05))
    try:
        assert watched.current.match("beta") is None
        path.write_text("alpha\nbeta\n", encoding="utf-8")
        os.utime(path, ns=(1, 2))  # a different stamp however fast the write
        await _until(lambda: watched.current.match("beta") is not None)
        path.write_bytes(b"\xff\xfe broken")
        await asyncio.sleep(0.3)
        assert watched.current.match("beta") is not None  # the old list stays
        path.unlink()
        await _until(lambda: watched.current.size == 0)
    finally:
        watcher.cancel()


async def _until(condition: Callable[[], bool], within: float = 5.0) -> None:
    for _ in range(int(within / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the list was not reloaded")


def test_serve_refuses_a_list_that_is_not_utf8_with_one_line(tmp_path: Path) -> None:
    """A list saved in GBK stops `serve` before it listens: exit 2, the file named."""
    directory = own_copy(tmp_path)
    blocked = list_path(directory)
    blocked.write_bytes("禁词\n".encode("gbk"))
    result = _start("serve", directory, tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    # One line says why (start-up warnings, e.g. the labels' placeholder code, aside).
    (line,) = [
        line for line in result.stderr.splitlines() if line and " WARNING " not in line
    ]
    assert line.startswith(f"studio: configuration error: {blocked}: not UTF-8"), line
