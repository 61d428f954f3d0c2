"""The operator's blocked terms in one Aho–Corasick automaton, rebuilt on a change.

`content/moderation/blocked.txt` (or the operator's content directory's copy)
holds one term a line; `#` starts a comment. Every term is normalised like a
prompt (normalise.py) and added to one automaton, so a check is a single pass
over the prompt however long the list. The file is watched: a change is read
and a new automaton swapped in within `moderation.reload_seconds`, no restart;
a file that cannot be read then keeps the list in force and says why in the log.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import ahocorasick

from ..content import ContentError
from .normalise import normalise

_LOGGER: Final = logging.getLogger(__name__)
FILE: Final = Path("moderation") / "blocked.txt"


class WordListError(ContentError):
    """The list file cannot be read as UTF-8 text: start-up stops, naming it."""


@dataclass(frozen=True, slots=True)
class Match:
    """The listed term a text contains, as the operator wrote it."""

    term: str


class WordList:
    """Terms, normalised, in one automaton; empty matches nothing."""

    def __init__(self, terms: Iterable[str]) -> None:
        automaton = ahocorasick.Automaton()
        for term in terms:
            if key := normalise(term):
                automaton.add_word(key, term)
        self.size = len(automaton)
        if self.size:
            automaton.make_automaton()
        self._automaton = automaton

    def match(self, text: str) -> Match | None:
        """Return the first listed term the text contains, after normalising it."""
        if not self.size:
            return None
        for _, term in self._automaton.iter(normalise(text)):
            return Match(term)
        return None


def read_terms(path: Path) -> list[str]:
    """Read a list file's terms: one a line, blank lines and `#` comments skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise WordListError(f"{path}: not UTF-8 text ({err.reason})") from err
    except OSError as err:
        raise WordListError(f"{path}: cannot read it: {err.strerror}") from err
    return [term for line in lines if (term := line.split("#", 1)[0].strip())]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return info.st_mtime_ns, info.st_size


class WatchedList:
    """The list in force, and the file it comes from, looked at every few seconds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp = _stamp(path)
        self.current = self._load()

    def _load(self) -> WordList:
        if self._stamp is None:
            _LOGGER.warning("no %s: no term is blocked", self.path)
            return WordList(())
        words = WordList(read_terms(self.path))
        _LOGGER.info("moderation list %s: %d terms", self.path, words.size)
        return words

    async def reload_if_changed(self) -> bool:
        """Rebuild the automaton if the file changed; say whether it did."""
        stamp = _stamp(self.path)
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        loop = asyncio.get_running_loop()
        try:
            self.current = await loop.run_in_executor(None, self._load)
        except WordListError as err:
            _LOGGER.error("moderation list kept as it was: %s", err)
            return False
        return True

    async def watch(self, interval: float) -> None:
        """Look at the file every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            await self.reload_if_changed()


def list_path(content_dir: Path) -> Path:
    """Name the list file inside a content directory."""
    return content_dir / FILE
