"""Jobs in flight per upstream across the fleet, so every worker keeps a vendor's limit.

One Redis key per upstream holds the slots: a sorted set of holders scored by
when their lease ends, changed only by one script (take, renew, give back). A
worker takes a slot before calling the upstream and waits, within the job's
deadline, while none is free; it renews the lease while the call runs and gives
the slot back when it ends. A worker that dies keeps its slot only until the
lease passes: the next `take` drops expired holders first.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ...store.connect import STORE_ERRORS

_LOGGER: Final = logging.getLogger(__name__)
_SCRIPT: Final = (Path(__file__).parent / "lua" / "slots.lua").read_text()
# A waiting worker tries again after this long at first, then up to the longest.
FIRST_WAIT: Final = 0.05
LONGEST_WAIT: Final = 1.0


def slots_key(upstream: str) -> str:
    """Return the key of an upstream's slots."""
    return f"studio:upstream-slots:{upstream}"


class UpstreamSlots:
    """At most `limit` holders at once across all workers; leases expire."""

    def __init__(
        self, redis: Redis | RedisCluster, upstream: str, limit: int, lease: float
    ) -> None:
        if limit < 1 or lease <= 0:
            raise ValueError("an upstream's slots need a limit >= 1 and a lease")
        self.upstream = upstream
        self.limit = limit
        self.lease = lease
        self._key = slots_key(upstream)
        self._script = redis.register_script(_SCRIPT)

    async def _run(self, action: str, holder: str) -> int:
        lease_ms = str(max(1, round(self.lease * 1000)))
        args = [action, holder, str(self.limit), lease_ms]
        return int(await self._script(keys=[self._key], args=args))

    async def take(self, holder: str) -> bool:
        """Take a slot now if one is free (or renew one already held)."""
        return await self._run("take", holder) == 1

    async def renew(self, holder: str) -> bool:
        """Extend a held slot's lease; False means it was lost and none is free."""
        return await self._run("renew", holder) == 1

    async def give(self, holder: str) -> None:
        """Give a slot back at once."""
        await self._run("give", holder)

    async def wait(self, holder: str) -> None:
        """Take a slot, waiting as long as it takes (the caller bounds the wait)."""
        delay = FIRST_WAIT
        while not await self.take(holder):
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, LONGEST_WAIT)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[str]:
        """Hold one slot for the body of the block, renewing its lease meanwhile."""
        holder = secrets.token_hex(8)
        try:
            await self.wait(holder)
        except asyncio.CancelledError:  # a take may have landed as the wait ended
            await self._give_back(holder)
            raise
        renewing = asyncio.create_task(self._renew(holder), name="slot-lease")
        try:
            yield holder
        finally:
            renewing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewing
            await self._give_back(holder)

    async def _give_back(self, holder: str) -> None:
        try:  # the lease frees it anyway if Redis cannot be told now
            await asyncio.shield(self.give(holder))
        except STORE_ERRORS as err:
            _LOGGER.warning("slot of %s not given back: %s", self.upstream, err)

    async def _renew(self, holder: str) -> None:
        while True:
            await asyncio.sleep(self.lease / 3)
            try:
                if not await self.renew(holder):
                    _LOGGER.warning("slot of %s lost: its lease ran out", self.upstream)
            except STORE_ERRORS as err:
                _LOGGER.warning("slot of %s not renewed: %s", self.upstream, err)
