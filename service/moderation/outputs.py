"""The output check: a generation's images (a clip by its poster and sampled frames).

A worker calls it once the outputs are stored and before the generation is
settled. A refusal fails the generation CONTENT_BLOCKED (refunded, its media
deleted, one log record). A provider that does not answer is asked again,
with growing pauses, until MARGIN_SECONDS before the job's deadline (after
which the queue would time it out); then the generation fails UPSTREAM_FAILED.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from ..settings import ModerationSettings
from .log import Record
from .providers.base import Picture, Provider, ProviderError, Verdict
from .providers.chosen import provider_for

_LOGGER: Final = logging.getLogger(__name__)
MARGIN_SECONDS: Final = 1.0
FIRST_PAUSE_SECONDS: Final = 0.5


class OutputRefused(Exception):
    """The generation must fail with `code`; `record` goes to the log if it does."""

    def __init__(self, code: str, record: Record | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.record = record


class OutputCheck:
    """Ask the provider about every output; nothing to do without one."""

    def __init__(self, settings: ModerationSettings) -> None:
        self._provider: Provider | None = provider_for(settings)
        self._timeout = settings.timeout

    @property
    def enabled(self) -> bool:
        """Tell whether outputs are checked at all (a provider is configured)."""
        return self._provider is not None

    async def check(
        self,
        keys: Sequence[str],
        picture: Callable[[str], Awaitable[Picture]],
        deadline: float,
        *,
        account: str,
        generation: Mapping[str, str],
    ) -> None:
        """Raise OutputRefused for the first refused image, or when no answer came."""
        if self._provider is None:
            return
        for key in keys:
            verdict = await self._ask(self._provider, await picture(key), deadline)
            if verdict.blocked:
                raise OutputRefused(
                    "CONTENT_BLOCKED",
                    Record(
                        source="output",
                        verdict="blocked",
                        account=account,
                        generation=generation.get("id", ""),
                        rule=verdict.label,
                        text=generation.get("prompt", ""),
                    ),
                )

    async def _ask(
        self, provider: Provider, picture: Picture, deadline: float
    ) -> Verdict:
        pause = FIRST_PAUSE_SECONDS
        while True:
            left = deadline - MARGIN_SECONDS - time.time()
            if left <= 0:
                raise OutputRefused("UPSTREAM_FAILED")
            try:
                async with asyncio.timeout(min(self._timeout, left)):
                    return await provider.image(picture)
            except (ProviderError, TimeoutError) as err:
                _LOGGER.warning("%s image check: %s; asking again", provider.name, err)
            await asyncio.sleep(
                max(0.0, min(pause, deadline - MARGIN_SECONDS - time.time()))
            )
            pause = min(pause * 2, 10.0)
