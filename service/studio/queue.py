"""The job queue: Redis Streams with one consumer group each, at-least-once delivery.

Jobs enter a stream in the submit script, in the same step that charges them.

Why hand-written on Streams rather than arq, SAQ, taskiq or streaq (report E):
none of them re-runs a SIGKILLed worker's job promptly by default (arq 310 s,
SAQ never with one retry, taskiq only on new traffic, streaq 60 s), taskiq has
no cancel, and none keeps its keys in one hash tag for Redis Cluster. A
consumer group gives at-least-once delivery with batched reads; a running job's
idle time is its lease (renewed with XCLAIM), a stale one is taken over with
XAUTOCLAIM, and the money stays exact because settlement is a state transition
of the generation, not a property of delivery.

Shards, for Redis Cluster: the submit script debits an account and enqueues
its job in one atomic step, so the account and the stream must share a slot.
The queue is SHARDS streams whose hash tags sit in SHARDS evenly spaced slots,
and a new account's id is drawn (by rejection, about 16384 / SHARDS tries,
once per account) until its own slot is one of them: every account's jobs go
to the shard in its slot. Workers read every shard. Ids that predate this
(tests, a single Redis) map to a shard by a stable hash; on a single server
any pairing is atomic. The price: account data lives in SHARDS slots, so a
cluster spreads it over at most SHARDS masters.

Reads: a worker takes the jobs that waited longest over every shard's line,
each shard giving its share; on a single Redis one script plans and reads (one
round trip), a cluster reads the lines in one pipeline and the shards in
another, each node's part sent at once. Idle, it blocks on every shard with
XREAD until the next submit (a cluster: it waits for READY_CHANNEL). Its
running jobs' leases are renewed in one pipeline.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from ..store.connect import is_cluster
from ..store.wire import run_script, wire_of
from .ledger import pairs, text

SHARDS: Final = 16
GROUP: Final = "workers"
CANCEL_CHANNEL: Final = "studio:jobs:cancel"
# The submit script rings this after every enqueue: idle workers read at once.
READY_CHANNEL: Final = "studio:jobs:ready"
_LUA: Final = Path(__file__).parent / "lua"
# finish_job.lua is shared with the settle script, which finishes ended jobs too.
_SCRIPT: Final = "".join(
    (_LUA / f"{name}.lua").read_text() for name in ("finish_job", "queue")
)
_SPAN: Final = 16384 // SHARDS


def _tag(shard: int) -> str:
    """The first tag `q<shard>.<n>` whose slot falls in the shard's 1/SHARDS range."""
    for n in itertools.count():
        tag = f"q{shard}.{n}"
        if key_slot(tag.encode()) // _SPAN == shard:
            return tag
    raise AssertionError("unreachable")


TAGS: Final = tuple(_tag(shard) for shard in range(SHARDS))
_SHARD_OF_SLOT: Final = {key_slot(tag.encode()): i for i, tag in enumerate(TAGS)}


def prefix(shard: int) -> str:
    """Name a shard's keys: studio:jobs:{<tag>}."""
    return f"studio:jobs:{{{TAGS[shard]}}}"


def waiting_key(shard: int) -> str:
    """Name a shard's line of waiting jobs (it shares the shard's hash tag)."""
    return f"{prefix(shard)}:waiting"


def shard_of(account_id: str) -> int:
    """The shard that shares the account's slot (or a stable pick for old ids)."""
    slot = key_slot(account_id.encode())
    return _SHARD_OF_SLOT.get(slot, slot % SHARDS)


def new_account_id() -> str:
    """Draw a random account id whose slot is a shard's slot (Cluster co-location)."""
    while True:
        candidate = secrets.token_hex(12)
        if key_slot(candidate.encode()) in _SHARD_OF_SLOT:
            return candidate


def _ref(shard: int, entry: str) -> str:
    """A delivery's reference: the shard and its stream entry id ('' for none)."""
    return f"{shard}/{entry}"


def _split(ref: str) -> tuple[int, str]:
    shard, _, entry = ref.partition("/")
    return int(shard), entry


def stream(shard: int) -> str:
    """Name a shard's stream."""
    return f"{prefix(shard)}:stream"


_SHARD_OF_STREAM: Final = {stream(shard).encode(): shard for shard in range(SHARDS)}
# What the submit script writes as an entry's `g`: a generation id.
_GENERATION_ID: Final = re.compile(rb"[0-9a-fA-F]+")
_LOGGER: Final = logging.getLogger(__name__)


def _job(shard: int, entry: Any, fields: Any) -> tuple[str, str | None]:
    """A stream entry as (reference, generation id); None if it names no job.

    Only the submit script writes the streams, but an entry written by hand or
    by another program must not stop the workers: it is dropped (`_drop`).
    """
    gid = fields.get(b"g") if fields else None
    ref = _ref(shard, text(entry))
    return ref, text(gid) if gid is not None and _GENERATION_ID.fullmatch(gid) else None


def _deliveries(reply: Any) -> tuple[list[tuple[str, str]], list[str]]:
    """An XREADGROUP reply as its jobs and the entries that are none.

    A deleted entry (no fields) is neither.
    """
    jobs, strays = [], []
    for name, entries in reply or []:
        for entry, fields in entries:
            ref, gid = _job(_SHARD_OF_STREAM[name], entry, fields)
            if gid is not None:
                jobs.append((ref, gid))
            elif fields:
                strays.append(ref)
    return jobs, strays


def _dropped(count: int) -> None:
    if count:
        _LOGGER.warning("queue: dropped %d stream entries that name no job", count)


@dataclass(frozen=True, slots=True)
class Batch:
    """The jobs one read took, and whether any job was waiting when it planned."""

    jobs: list[tuple[str, str]]
    waiting: bool


def entry_in(ref: str, account_id: str) -> str:
    """The delivery's stream entry if its shard is the account's, else "".

    The settle script finishes such a job itself (they share a slot); any
    other (an id from before the shards) is finished on its own.
    """
    shard, entry = _split(ref)
    return entry if shard == shard_of(account_id) else ""


def shard_ref(shard: int) -> str:
    """A reference to a shard with no delivery (a job found by its deadline)."""
    return _ref(shard, "")


class JobQueue:
    """Reserve, commit, deliver, renew, reclaim and finish jobs, over all shards.

    A delivery is named by a reference `<shard>/<entry id>`; entry ids are only
    unique within one stream.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)
        self._wire = wire_of(redis)  # the script's runs go out on it (wire.py)
        self._next = 0  # the shard a read starts at, rotating for fairness
        self._cluster = is_cluster(redis)

    async def ensure_group(self) -> None:
        """Create every stream and its consumer group once; again is a no-op."""
        for shard in range(SHARDS):
            try:
                await self._redis.xgroup_create(
                    f"{prefix(shard)}:stream", GROUP, id="0", mkstream=True
                )
            except ResponseError as err:
                if "BUSYGROUP" not in str(err):
                    raise

    async def finish(self, gid: str, ref: str) -> None:
        """Acknowledge and delete a job that needs no more running."""
        shard, entry = _split(ref)
        await run_script(
            self._wire, self._script, [prefix(shard)], ["finish", gid, entry]
        )

    async def job(self, ref: str, gid: str) -> dict[str, str]:
        """Read a job's record (empty if it is finished)."""
        shard, _ = _split(ref)
        fields = await self._redis.hgetall(f"{prefix(shard)}:job:{gid}")
        return {text(k): text(v) for k, v in fields.items()}

    async def take(self, ref: str, gid: str) -> dict[str, str]:
        """Read a job's record and count one more run of it, in one step.

        Empty if the job is finished: nothing is counted, nothing made again.
        """
        shard, _ = _split(ref)
        reply = await run_script(
            self._wire, self._script, [prefix(shard)], ["take", gid]
        )
        return pairs(reply)

    async def read(self, consumer: str, count: int) -> Batch:
        """Take up to `count` new jobs, oldest first, without waiting.

        The shards' lines say which jobs waited longest, and each shard gives
        its share of them: on a single Redis one script plans and reads in one
        round trip; a cluster (whose shards' keys sit in different slots)
        reads the lines in one pipeline, then the shards in another, sent to
        each node at once. If the plan's jobs were all taken by other workers
        first, `count` shards in turn are read for one job each. A read never
        delivers more than `count`: a job delivered is this worker's until its
        lease lapses.
        """
        if self._cluster:
            planned = await self._oldest(count)
            found = await self._each(consumer, planned)
            waiting = bool(planned)
        else:
            reply = await run_script(
                self._wire,
                self._script,
                [prefix(shard) for shard in range(SHARDS)],
                ["read", consumer, count],
            )
            found = [
                (_ref(int(reply[i]), text(reply[i + 1])), text(reply[i + 2]))
                for i in range(2, len(reply), 3)
            ]
            waiting = int(reply[0]) > 0
            _dropped(int(reply[1]))
        if found:
            return Batch(found, waiting=True)
        start, self._next = self._next, (self._next + count) % SHARDS
        turn = [(start + step) % SHARDS for step in range(min(count, SHARDS))]
        if self._cluster:
            found = await self._each(consumer, dict.fromkeys(turn, 1))
        else:
            reply = await self._redis.xreadgroup(
                GROUP, consumer, {stream(shard): ">" for shard in turn}, count=1
            )
            found, strays = _deliveries(reply)
            await self._drop(strays)
        return Batch(found, waiting=bool(waiting or found))

    async def wait(self, block_ms: int) -> None:
        """On a single Redis, wait up to `block_ms` for the next job to be queued.

        XREAD (not XREADGROUP) with BLOCK over every shard: it wakes with the
        first submit, as a blocking group read would, but delivers nothing, so
        the next `read` takes the oldest jobs and no more than there is room
        for (a blocking group read may hand over one job per shard at once).
        Canceling it loses nothing.
        """
        await self._redis.xread(
            {stream(shard): "$" for shard in range(SHARDS)}, count=1, block=block_ms
        )

    async def _each(
        self, consumer: str, wanted: dict[int, int]
    ) -> list[tuple[str, str]]:
        """Read each shard with its own XREADGROUP, all in one pipeline."""
        if not wanted:
            return []
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard, most in wanted.items():
                pipe.xreadgroup(GROUP, consumer, {stream(shard): ">"}, count=most)
            replies = await pipe.execute()
        found, strays = [], []
        for reply in replies:
            jobs, others = _deliveries(reply)
            found += jobs
            strays += others
        await self._drop(strays)
        return found

    async def _drop(self, strays: Sequence[str]) -> None:
        """Acknowledge and delete entries that name no job, so none comes back."""
        if not strays:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for ref in strays:
                shard, entry = _split(ref)
                pipe.xack(stream(shard), GROUP, entry)
                pipe.xdel(stream(shard), entry)
            await pipe.execute()
        _dropped(len(strays))

    async def _oldest(self, count: int) -> dict[int, int]:
        """Plan a read across shards: the `count` jobs waiting longest, per shard.

        Each shard's line (`<prefix>:waiting`, scored by submit time) gives its
        first `count`; the oldest of all decide how many each shard gives, so
        jobs start in the order they were submitted whatever their shard.
        """
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(SHARDS):
                pipe.zrange(waiting_key(shard), 0, count - 1, withscores=True)
            heads = await pipe.execute()
        oldest = sorted(
            (score, shard) for shard, line in enumerate(heads) for _, score in line
        )[:count]
        planned: dict[int, int] = {}
        for _, shard in oldest:
            planned[shard] = planned.get(shard, 0) + 1
        return planned

    async def renew(self, consumer: str, refs: Sequence[str]) -> None:
        """Reset the idle time of running jobs: their lease."""
        await self._claim(consumer, refs)

    async def hand_back(self, consumer: str, refs: Sequence[str], idle_ms: int) -> None:
        """Mark jobs as idle for a whole lease, so another worker takes them at once."""
        await self._claim(consumer, refs, idle=idle_ms)

    async def _claim(
        self, consumer: str, refs: Sequence[str], idle: int | None = None
    ) -> None:
        by_shard: dict[int, list[Any]] = {}
        for ref in refs:
            shard, entry = _split(ref)
            by_shard.setdefault(shard, []).append(entry)
        if not by_shard:
            return
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard, entries in by_shard.items():
                pipe.xclaim(
                    stream(shard), GROUP, consumer, 0, entries, idle=idle, justid=True
                )
            await pipe.execute()

    async def reclaim(
        self, consumer: str, min_idle_ms: int, count: int
    ) -> list[tuple[str, str]]:
        """Take over jobs whose worker stopped renewing them."""
        found: list[tuple[str, str]] = []
        for shard in range(SHARDS):
            if len(found) >= count:
                break
            reply: Any = await self._redis.xautoclaim(
                f"{prefix(shard)}:stream", GROUP, consumer, min_idle_ms, "0-0",
                count=count - len(found),
            )  # fmt: skip
            jobs, strays = _deliveries([(stream(shard).encode(), reply[1])])
            found += jobs
            await self._drop(strays)
        return found

    async def due(self, now: float, count: int = 100) -> list[tuple[str, str]]:
        """Return jobs past their deadline: (shard reference, generation id)."""
        found: list[tuple[str, str]] = []
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(SHARDS):
                pipe.zrangebyscore(
                    f"{prefix(shard)}:deadlines", "-inf", now, start=0, num=count
                )
            replies = await pipe.execute()
        for shard, gids in enumerate(replies):
            found += [(shard_ref(shard), text(gid)) for gid in gids]
        return found[:count]

    async def depth(self) -> int:
        """Count jobs waiting or running."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for shard in range(SHARDS):
                pipe.zcard(f"{prefix(shard)}:deadlines")
            return sum(int(n) for n in await pipe.execute())

    async def cancel(self, gid: str) -> None:
        """Tell the worker running a generation to stop it."""
        await self._redis.publish(CANCEL_CHANNEL, gid)
