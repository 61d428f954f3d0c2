"""One normal form for prompts and listed terms, so spelling tricks do not hide a term.

Both sides go through the same steps (CONTRACT §11): Unicode NFKC (full-width
letters and digits become half-width), case folding, traditional to simplified
Chinese (OpenCC's t2s tables), and every space, punctuation mark, symbol,
control and zero-width character removed. `禁 词`, `禁-词`, `禁\u200b词`,
`禁詞` and `ＪＩＮ` then read `禁词` and `jin`.
"""

from __future__ import annotations

import unicodedata
from typing import Final

import opencc

# General categories removed: separators (Z*), punctuation (P*), symbols (S*),
# and "other" (C*: controls, format characters such as U+200B..U+200D and
# U+FEFF, unassigned and private-use code points).
_REMOVED: Final = frozenset("ZPSC")


class _Removal(dict[int, int | None]):
    """A str.translate table filled on demand: each code point is looked up once."""

    def __missing__(self, point: int) -> int | None:
        kept = unicodedata.category(chr(point))[0] not in _REMOVED
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
