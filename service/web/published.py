"""The public documents as served today, rendered again when a model retires.

The documents and machine files are prepared bytes rendered at start-up. The
models they offer depend on the day (a model past its `retires_at` is offered
nowhere), so each process keeps one *edition*, the handlers of every public
route for the models on offer, and a timer swaps in a new edition at the UTC
midnight a retirement takes effect. The swap is one reference assignment, so a
request sees the old edition or the new one, never a mix.

Several processes stay in step without talking to each other: each computes
the same retirement dates from content/models.toml and its own UTC clock, so
they all swap at the same midnight (within their clocks' skew). Submit and the
workers decide with the same function on every job, so nobody is charged for a
retired model even if a timer is late.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from ..clock import Clock, midnight
from ..content import Content, Model

_LOGGER: Final = logging.getLogger(__name__)
# The timer looks at the clock at least this often, so a wall clock that jumps
# (a suspended machine, a corrected clock) is noticed within the hour.
LONGEST_SLEEP: Final = 3600.0

Render = Callable[[tuple[Model, ...]], Mapping[str, Handler]]


@dataclass(frozen=True, slots=True)
class Edition:
    """The public handlers rendered for one set of models on offer."""

    offered: tuple[Model, ...]
    handlers: Mapping[str, Handler]


class Published:
    """Serve the current edition; replace it when the models on offer change."""

    def __init__(self, content: Content, render: Render, clock: Clock) -> None:
        self._content = content
        self._render = render
        self._clock = clock
        offered = content.offered(self.today())
        self.edition = Edition(offered, render(offered))

    def today(self) -> dt.date:
        """Return today's date in UTC by this app's clock."""
        return self._clock().date()

    def handlers(self) -> dict[str, Handler]:
        """Return one handler per public route, each serving the current edition."""
        return {name: self._route(name) for name in self.edition.handlers}

    def _route(self, name: str) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            return await self.edition.handlers[name](request)

        return handler

    async def refresh(self) -> bool:
        """Render a new edition if the models on offer changed; tell whether it did.

        The rendering runs on a thread (it waits for the Markdown converter's
        child process), so requests go on being served from the old edition.
        """
        offered = self._content.offered(self.today())
        if offered == self.edition.offered:
            return False
        handlers = await asyncio.to_thread(self._render, offered)
        gone = sorted(m.id for m in self.edition.offered if m not in offered)
        self.edition = Edition(offered, handlers)
        _LOGGER.info("public documents rendered again, without %s", gone)
        return True

    def seconds_to_next_change(self) -> float | None:
        """Return how long until the next retirement midnight (None: no more)."""
        day = self._content.next_retirement(self.today())
        if day is None:
            return None
        return max(0.0, (midnight(day) - self._clock()).total_seconds())

    async def follow(self) -> None:
        """Sleep until each retirement midnight and render the documents again."""
        while True:
            await self.refresh()
            wait = self.seconds_to_next_change()
            if wait is None:
                return
            # A little past midnight, so the clock surely reads the new day.
            await asyncio.sleep(min(wait + 0.01, LONGEST_SLEEP))

    async def ctx(self, app: web.Application) -> AsyncIterator[None]:
        """Run the retirement timer for the life of the app."""
        task = asyncio.create_task(self.follow(), name="retirements")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
