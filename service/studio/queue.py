"""The job queue: a Redis Stream with one consumer group, at-least-once delivery.

Jobs enter the stream in the submit script, in the same step that charges them.

Why hand-written on Streams rather than arq, SAQ, taskiq or streaq (report E):
none of them re-runs a SIGKILLed worker's job promptly by default (arq 310 s,
SAQ never with one retry, taskiq only on new traffic, streaq 60 s), taskiq has
no cancel, and none keeps its keys in one hash tag for Redis Cluster. A
consumer group gives at-least-once delivery with batched reads; a running job's
idle time is its lease (renewed with XCLAIM), a stale one is taken over with
XAUTOCLAIM, and the money stays exact because settlement is a state transition
of the generation, not a property of delivery.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import ResponseError

from .ledger import text

PREFIX: Final = "studio:jobs:{q}"
STREAM: Final = f"{PREFIX}:stream"
GROUP: Final = "workers"
CANCEL_CHANNEL: Final = "studio:jobs:cancel"
_SCRIPT: Final = (Path(__file__).parent / "lua" / "queue.lua").read_text()


class JobQueue:
    """Reserve, commit, deliver, renew, reclaim and finish jobs."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)

    async def _run(self, *args: str | int | float) -> Any:
        return await self._script(keys=[PREFIX], args=list(args))

    async def ensure_group(self) -> None:
        """Create the stream and its consumer group once; a second call is a no-op."""
        try:
            await self._redis.xgroup_create(STREAM, GROUP, id="0", mkstream=True)
        except ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    async def finish(self, gid: str, entry: str = "") -> None:
        """Acknowledge and delete a job that needs no more running."""
        await self._run("finish", gid, entry)

    async def job(self, gid: str) -> dict[str, str]:
        """Read a job's record (empty if it is finished)."""
        fields = await self._redis.hgetall(f"{PREFIX}:job:{gid}")
        return {text(k): text(v) for k, v in fields.items()}

    async def attempt(self, gid: str) -> int:
        """Count one more run of a job."""
        return int(await self._redis.hincrby(f"{PREFIX}:job:{gid}", "attempts", 1))

    async def read(
        self, consumer: str, count: int, block_ms: int
    ) -> list[tuple[str, str]]:
        """Take up to `count` new jobs for this consumer: (entry id, generation id)."""
        reply: Any = await self._redis.xreadgroup(
            GROUP, consumer, {STREAM: ">"}, count=count, block=block_ms
        )
        return [
            (text(entry), text(fields[b"g"]))
            for _, entries in reply or []
            for entry, fields in entries
            if fields
        ]

    async def renew(self, consumer: str, entries: Sequence[str]) -> None:
        """Reset the idle time of running jobs: their lease."""
        if entries:
            await self._redis.xclaim(
                STREAM, GROUP, consumer, 0, list(entries), justid=True
            )

    async def hand_back(
        self, consumer: str, entries: Sequence[str], idle_ms: int
    ) -> None:
        """Mark jobs as idle for a whole lease, so another worker takes them at once."""
        if entries:
            await self._redis.xclaim(
                STREAM, GROUP, consumer, 0, list(entries), idle=idle_ms, justid=True
            )

    async def reclaim(
        self, consumer: str, min_idle_ms: int, count: int
    ) -> list[tuple[str, str]]:
        """Take over jobs whose worker stopped renewing them."""
        reply: Any = await self._redis.xautoclaim(
            STREAM, GROUP, consumer, min_idle_ms, "0-0", count=count
        )
        return [
            (text(entry), text(fields[b"g"])) for entry, fields in reply[1] if fields
        ]

    async def due(self, now: float, count: int = 100) -> list[str]:
        """Return jobs past their deadline."""
        found: list[bytes] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            f"{PREFIX}:deadlines", "-inf", now, start=0, num=count
        )
        return [text(gid) for gid in found]

    async def depth(self) -> int:
        """Count jobs waiting or running."""
        return int(await self._redis.zcard(f"{PREFIX}:deadlines"))

    async def cancel(self, gid: str) -> None:
        """Tell the worker running a generation to stop it."""
        await self._redis.publish(CANCEL_CHANNEL, gid)
