"""Files a run stores before its generation settles, noted first, so none is lost.

A worker killed between storing a job's files and settling the generation
would leave them in the media store for good: the job runs again and makes
new ones. So each key is noted in Redis (`studio:media:pending`, scored by
when) before its file is put. A run that settles or discards its files takes
its notes back; what a killed run left is swept by any worker's janitor once
the generation is final: a sampled frame always goes, an output goes unless
the work it was made for holds it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis

from ..ledger import text

PENDING: Final = "studio:media:pending"


@dataclass(frozen=True, slots=True)
class Note:
    """One stored file of a run: whose, which generation, which work ("" for a
    sampled frame that no work keeps), and its key."""

    account: str
    gid: str
    work_id: str
    key: str

    @property
    def member(self) -> str:
        """The note as the sorted set holds it."""
        return f"{self.account}/{self.gid}/{self.work_id}/{self.key}"

    @classmethod
    def parse(cls, member: str) -> Note | None:
        """Read a member back; None for one this module did not write."""
        parts = member.split("/", 3)
        return cls(*parts) if len(parts) == 4 and all(parts[:2] + parts[3:]) else None


class PendingMedia:
    """Note files before they are stored; take the notes back; list the stale ones."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def note(self, notes: list[Note]) -> None:
        """Write files' notes down, in one command; only then may they be put."""
        if notes:
            moment = time.time()
            await self._redis.zadd(PENDING, {note.member: moment for note in notes})

    async def settled(self, notes: list[Note]) -> None:
        """Take back the notes of files that are now kept or deleted."""
        if notes:
            await self._redis.zrem(PENDING, *(note.member for note in notes))

    async def later(self, note: Note) -> None:
        """Look at a note again later: its job still runs."""
        await self._redis.zadd(PENDING, {note.member: time.time()}, xx=True)

    async def stale(self, before: float, count: int = 20) -> list[Note]:
        """List notes written before a time, oldest first (younger ones most
        likely belong to a run that is alive)."""
        found: list[bytes] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            PENDING, "-inf", before, start=0, num=count
        )
        notes = [Note.parse(text(member)) for member in found]
        strays = [text(m) for m, n in zip(found, notes, strict=True) if n is None]
        if strays:
            await self._redis.zrem(PENDING, *strays)
        return [note for note in notes if note is not None]
