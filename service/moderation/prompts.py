"""The checks every submit, publish and upload passes before anything is kept.

Texts go through the word list, then the provider (if one is configured);
uploaded images through the provider. A provider that does not answer within
`moderation.timeout` makes the request answer 503 UNAVAILABLE (nothing was
kept; the client may try again): with a provider configured, nothing passes
unchecked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Mapping
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from ..api.errors import UNAVAILABLE_RETRY_AFTER, ApiError
from .log import ModerationLog, Record
from .providers.base import Picture, Provider, ProviderError, Verdict
from .wordlist import Match, WatchedList


@dataclass(frozen=True, slots=True)
class Moderation:
    """The word list in force and the log its refusals go to."""

    words: WatchedList
    log: ModerationLog
    provider: Provider | None = None
    timeout: float = 10.0

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
            if not text:
                continue
            if (found := self.verdict(text)) is not None:
                rule = found.term
            elif self.provider and (said := await self._ask(self.provider.text(text))):
                rule = said.label
            else:
                continue
            await self.log.append(
                Record(
                    source=source,
                    verdict="blocked",
                    account=account,
                    generation=generation,
                    work=work,
                    rule=rule,
                    text=text,
                    field=field,
                )
            )
            raise ApiError(400, "CONTENT_BLOCKED", field=field)

    async def screen_image(self, picture: Picture, *, account: str) -> None:
        """Refuse an upload the provider blocks: one log record, then 400 `file`."""
        if self.provider and (said := await self._ask(self.provider.image(picture))):
            record = Record(
                source="upload", verdict="blocked", account=account, rule=said.label
            )
            await self.log.append(record)
            raise ApiError(400, "CONTENT_BLOCKED", field="file")

    async def _ask(self, asking: Awaitable[Verdict]) -> Verdict | None:
        """Return the provider's verdict if it blocks; 503 when it does not answer."""
        try:
            async with asyncio.timeout(self.timeout):
                verdict = await asking
        except (ProviderError, TimeoutError) as err:
            _LOGGER.warning("moderation provider: %s", err)
            headers = {"Retry-After": UNAVAILABLE_RETRY_AFTER}
            raise ApiError(503, "UNAVAILABLE", headers=headers) from None
        return verdict if verdict.blocked else None


MODERATION: Final = web.AppKey("moderation", Moderation)
_LOGGER: Final = logging.getLogger(__name__)
