"""Purge the accounts whose grace period is over: a task every worker runs."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Final

from ..store.connect import STORE_ERRORS
from .deletion import DeletionStore

_LOGGER: Final = logging.getLogger(__name__)
# Accounts purged in one pass, the longest waiting first.
BATCH: Final = 100


class Purger:
    """Look every `every` s for accounts whose purge_at passed, and purge them.

    Every worker process runs one. Two at once are harmless: each step of a
    purge is idempotent, and a purge cut short is finished by the next pass
    (the account stays in the queue until its hash is gone).
    """

    def __init__(self, store: DeletionStore, *, every: float) -> None:
        self.store = store
        self.every = every

    async def run(self, stop: asyncio.Event) -> None:
        """Pass over the due accounts until `stop` is set."""
        while not stop.is_set():
            try:
                await self.pass_once()
            except STORE_ERRORS as err:
                _LOGGER.warning("purger: store unavailable: %s", type(err).__name__)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.every)

    async def pass_once(self, now: float | None = None) -> int:
        """Purge every account due now; count those purged."""
        now = time.time() if now is None else now
        purged = 0
        for account_id in await self.store.due(now, BATCH):
            if await self.store.purge(account_id, now):
                purged += 1
        if purged:
            _LOGGER.info("purger: %d accounts purged", purged)
        return purged
