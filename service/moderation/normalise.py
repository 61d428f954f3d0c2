"""One normal form for prompts and listed terms, so spelling tricks do not hide a term.

Both sides go through the same steps (CONTRACT §11): Unicode NFKC (full-width
letters and digits become half-width), case folding, traditional to simplified
Chinese (OpenCC's t2s tables), and every space, punctuation mark, symbol,
control, combining mark and zero-width character removed. `禁 词`, `禁-词`,
`禁\u200b词`, `禁\ufe0f词`, `c\u0336h\u0336i\u0336n`, `禁詞` and `ＪＩＮ` then read
`禁词` and `jin`.
"""

from __future__ import annotations

import unicodedata
from typing import Final

import opencc

# General categories removed: separators (Z*), punctuation (P*), symbols (S*),
# "other" (C*: controls, format characters such as U+200B..U+200D and U+FEFF,
# unassigned and private-use code points) and marks (M*: the invisible
# variation selectors U+FE00..U+FE0F and U+E0100..U+E01EF, the grapheme joiner
# U+034F, and strokes or circles drawn over a letter such as U+0336). NFKC has
# already joined a letter and its accent into one letter, so no word loses one.
_REMOVED: Final = frozenset("ZPSCM")
# Invisible yet letters (Lo): the Hangul fillers, Default_Ignorable_Code_Point
# in Unicode's DerivedCoreProperties, as every zero-width character above is.
_FILLERS: Final = frozenset({0x115F, 0x1160, 0x3164, 0xFFA0})


class _Removal(dict[int, int | None]):
    """A str.translate table filled on demand: each code point is looked up once."""

    def __missing__(self, point: int) -> int | None:
        kept = (
            unicodedata.category(chr(point))[0] not in _REMOVED
            and point not in _FILLERS
        )
        value = point if kept else None
        self[point] = value
        return value


_TABLE: Final = _Removal()
_SIMPLIFY: Final = opencc.OpenCC("t2s")


def normalise(text: str) -> str:
    """Return the form a text is matched in."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    simplified: str = _SIMPLIFY.convert(unicodedata.normalize("NFKC", folded))
    return simplified.translate(_TABLE)
