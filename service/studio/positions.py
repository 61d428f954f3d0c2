"""Place in line and estimated wait of generations, without scanning the queue.

Every queue shard keeps its waiting jobs in a sorted set (`<shard>:waiting`)
scored by the server's clock in microseconds at submit (unique within the
shard); the submit script adds a job, the transition out of `queued` (and the
queue's `finish`) removes it. A job's place is 1 + the jobs of every shard
queued before it: one ZCOUNT per shard, O(log n) each, whatever the depth
(one script call counts them for all of a page's queued jobs; on a cluster,
one call per shard).

The estimate comes from rolling windows the workers keep: the last RUNS run
times of each model and the last STARTS start times of any job.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from redis.asyncio import Redis

from ..store.connect import is_cluster
from .generations import view
from .ledger import text
from .queue import SHARDS, waiting_key

RUNS: Final = 50
STARTS: Final = 21
# How long one process reuses the windows it read (they move with each job).
WINDOW_SECONDS: Final = 2.0
# The event stream's pace: new places and estimates at most this often.
PUSH_SECONDS: Final = 2.0
RUNS_KEY: Final = "studio:eta:runs:"
# How many jobs of the lines named (KEYS: one shard's on a cluster, all of them
# on one server) were queued before each of the scores given.
_AHEAD: Final = """
local out = {}
for i, score in ipairs(ARGV) do
  local n = 0
  for _, line in ipairs(KEYS) do
    n = n + redis.call('ZCOUNT', line, '-inf', '(' .. score)
  end
  out[i] = n
end
return out
"""
_STARTS_KEY: Final = "studio:eta:starts"


class Timings:
    """A worker's starts and run times, sent to the estimate's windows in batches.

    Noted in memory as jobs start and end; the worker's janitor flushes them
    once a second in one round trip, so a job pays nothing for them.
    """

    def __init__(self) -> None:
        self._starts: list[float] = []
        self._runs: dict[str, list[float]] = {}

    def started(self, moment: float) -> None:
        """Note a job's start (epoch seconds)."""
        self._starts.append(moment)

    def ran(self, model: str, seconds: float) -> None:
        """Note a successful run's length."""
        self._runs.setdefault(model, []).append(seconds)

    async def flush(self, redis: Redis) -> None:
        """Push what was noted onto the windows, trimmed to their size."""
        starts, runs = self._starts, self._runs
        if not starts and not runs:
            return
        self._starts, self._runs = [], {}
        async with redis.pipeline(transaction=False) as pipe:
            for key, values, size in [
                (_STARTS_KEY, starts, STARTS),
                *((RUNS_KEY + model, times, RUNS) for model, times in runs.items()),
            ]:
                if values:
                    pipe.lpush(key, *(f"{value:.3f}" for value in values))
                    pipe.ltrim(key, 0, size - 1)
            await pipe.execute()


class Positions:
    """Fill `queue_position` and `eta_seconds` into generation views."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._ahead = redis.register_script(_AHEAD)
        self._runs: dict[str, float | None] = {}
        self._gap: float | None = None
        self._read_at = -WINDOW_SECONDS

    async def views(
        self, fields: Sequence[Mapping[str, str]], known: Mapping[str, int] = {}
    ) -> list[dict[str, Any]]:
        """Render stored generations with their place in line and estimate.

        `known`: places already counted (the submit's), by generation id.
        """
        shown = [view(item) for item in fields]
        queued = [f for f in fields if f.get("status") == "queued"]
        places = await self._places(
            ["" if f["id"] in known else f.get("queued_us", "") for f in queued]
        )
        live = [f for f in fields if f.get("status") in ("queued", "running")]
        if live:
            await self._windows({f["model"] for f in live})
        place_of = dict(zip((f["id"] for f in queued), places, strict=True))
        place_of.update(known)
        for out in shown:
            if out["status"] == "queued":
                out["queue_position"] = place_of[out["id"]]
            out["eta_seconds"] = self._eta(out)
        return shown

    async def _places(self, scores: Sequence[str]) -> list[int | None]:
        """Count, for each score, the waiting jobs of every shard before it."""
        known = [score for score in scores if score]
        if not known:
            return [None] * len(scores)
        counts = await self._counts(known)
        places = iter(1 + sum(column) for column in zip(*counts, strict=True))
        return [next(places) if score else None for score in scores]

    async def _counts(self, scores: Sequence[str]) -> list[list[int]]:
        """Count, per shard (or all at once), the jobs queued before each score.

        On one server a single script call counts all 16 lines. A cluster
        keeps each line on its own slot: there one call per shard, all at once.
        """
        keys = [waiting_key(shard) for shard in range(SHARDS)]
        if is_cluster(self._redis):
            return list(
                await asyncio.gather(
                    *(self._ahead(keys=[key], args=list(scores)) for key in keys)
                )
            )
        return [await self._ahead(keys=keys, args=list(scores))]

    async def _windows(self, models: Iterable[str]) -> None:
        """Read the run-time windows (at most every WINDOW_SECONDS per process)."""
        wanted = set(models)
        fresh = time.monotonic() - self._read_at < WINDOW_SECONDS
        if fresh and wanted <= self._runs.keys():
            return
        names = sorted(wanted | self._runs.keys())
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.lrange(_STARTS_KEY, 0, -1)
            for name in names:
                pipe.lrange(RUNS_KEY + name, 0, -1)
            starts, *runs = await pipe.execute()
        self._runs = {
            name: statistics.fmean(float(text(x)) for x in window) if window else None
            for name, window in zip(names, runs, strict=True)
        }
        moments = sorted(float(text(x)) for x in starts)
        gaps = [b - a for a, b in itertools.pairwise(moments)]
        self._gap = statistics.median(gaps) if gaps else None
        self._read_at = time.monotonic()

    def _eta(self, generation: Mapping[str, Any]) -> int | None:
        """Seconds until it finishes: the wait for the jobs ahead, then its run.

        Jobs start about one `gap` apart while there is a line (the median
        spacing of recent starts), never slower than one run after another.
        """
        run = self._runs.get(generation["model"])
        if run is None:
            return None
        if generation["status"] == "queued":
            ahead = (generation["queue_position"] or 1) - 1
            gap = min(self._gap, run) if self._gap is not None else run
            return round(ahead * gap + run)
        if generation["status"] == "running" and generation["started_at"]:
            started = dt.datetime.fromisoformat(generation["started_at"])
            elapsed = (dt.datetime.now(dt.UTC) - started).total_seconds()
            return max(0, round(run - elapsed))
        return None


class LineWatch:
    """One event stream's last place and estimate of each live generation.

    Each generation is looked at again PUSH_SECONDS after it was last sent or
    looked at; `due()` answers those whose place or estimate changed. The stream
    sleeps until `next_look()`, so a change is sent within PUSH_SECONDS and a
    generation is never sent twice within PUSH_SECONDS.
    """

    def __init__(self, positions: Positions) -> None:
        self._positions = positions
        self._sent: dict[str, tuple[Any, Any]] = {}
        self._look_at: dict[str, float] = {}

    def sent(self, generation: Mapping[str, Any]) -> None:
        """Note what a generation event carried (forget finished ones)."""
        key = generation["id"]
        if generation["status"] not in ("queued", "running"):
            self._sent.pop(key, None)
            self._look_at.pop(key, None)
            return
        self._sent[key] = (generation["queue_position"], generation["eta_seconds"])
        self._look_at[key] = time.monotonic() + PUSH_SECONDS

    def next_look(self) -> float | None:
        """When (monotonic) some generation is next looked at; None: none is live."""
        return min(self._look_at.values(), default=None)

    async def due(self, live: Sequence[Mapping[str, str]]) -> list[dict[str, Any]]:
        """Return the views of live generations whose place or estimate moved."""
        now = time.monotonic()
        ids = {item["id"] for item in live}
        for gone in self._look_at.keys() - ids:  # ended without an event seen here
            self._sent.pop(gone, None)
            self._look_at.pop(gone)
        ready = [f for f in live if self._look_at.get(f["id"], now) <= now]
        changed = []
        for shown in await self._positions.views(ready):
            self._look_at[shown["id"]] = now + PUSH_SECONDS
            if self._sent.get(shown["id"]) != (
                shown["queue_position"],
                shown["eta_seconds"],
            ):
                changed.append(shown)
        return changed
