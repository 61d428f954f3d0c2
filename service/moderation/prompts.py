"""The prompt check every submit and publish passes through before anything is kept."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from ..api.errors import ApiError
from .log import ModerationLog, Record
from .wordlist import Match, WatchedList


@dataclass(frozen=True, slots=True)
class Moderation:
    """The word list in force and the log its refusals go to."""

    words: WatchedList
    log: ModerationLog

    def verdict(self, text: str) -> Match | None:
        """Return the listed term a text contains, if any."""
        return self.words.current.match(text)

    async def screen(
        self,
        texts: Mapping[str, str],
        *,
        source: str,
        account: str,
        generation: str = "",
        work: str = "",
    ) -> None:
        """Refuse the first field whose text the list blocks: one log record, then 400.

        Nothing else is written: the caller has charged, queued and stored
        nothing yet (CONTRACT §11).
        """
        for field, text in texts.items():
            if text and (found := self.verdict(text)) is not None:
                await self.log.append(
                    Record(
                        source=source,
                        verdict="blocked",
                        account=account,
                        generation=generation,
                        work=work,
                        rule=found.term,
                        text=text,
                        field=field,
                    )
                )
                raise ApiError(400, "CONTENT_BLOCKED", field=field)


MODERATION: Final = web.AppKey("moderation", Moderation)
