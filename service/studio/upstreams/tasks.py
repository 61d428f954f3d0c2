"""The vendor-task shape written once: create, keep the id, poll, fetch, cancel.

Most vendors (Ark's videos, DashScope, Kling, MiniMax, ComfyUI) take a request
as a task, answer its id, and are polled until they report a result URL that
expires within hours. `TaskUpstream` runs that shape for any `TaskApi`, which
only maps its vendor's requests and answers:

    create(request) -> task id; or the outputs (a synchronous API); or a
                       Polled (the vendor answered the finished task at once)
    poll(request, task) -> Polled(state, fraction, results, code)
    cancel(task)    (best effort; a vendor without one does nothing)

The task id is kept in the job's memo (`RedisMemo`: one key per generation,
gone after the job's deadline) before the first poll, so a transient fault
retried by the worker, a re-delivery, or another worker after a SIGKILL polls
the same task: the vendor is never asked twice for a task it accepted. A busy
or unreachable poll is retried in place; results are downloaded the moment the
vendor reports success (fetch.py: size-capped, magic-checked, no LAN). When
the job is canceled, times out or fails while the task runs, the vendor is
told to cancel it; a worker shutting down hands the job back and leaves the
task running for the next worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, Final, Literal, Protocol

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from .base import Output, Progress, Request, UpstreamError
from .fetch import fetch_result
from .http import FAILED, UpstreamHttp
from .inputs import running

FIRST_POLL: Final = 0.2
LONGEST_POLL: Final = 3.0
CANCEL_SECONDS: Final = 5.0
WAITING: Final = 0.05

State = Literal["waiting", "running", "succeeded", "failed"]


async def to_the_end(cleanup: Coroutine[Any, Any, None]) -> None:
    """Run a bounded clean-up to its end; a cancel meanwhile is raised after it.

    A job is often canceled twice (its owner's message, the worker's own look
    at the record, its deadline): the second cancel must not cut short the
    telling of the first, or the vendor keeps running (and billing) the task.
    """
    running = asyncio.ensure_future(cleanup)
    canceled = False
    while not running.done():
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            canceled = True
    if canceled:
        raise asyncio.CancelledError


def memo_key(gid: str) -> str:
    """Return the key of a generation's vendor task."""
    return f"studio:upstream-task:{gid}"


class RedisMemo:
    """A job's vendor task id in Redis, alive as long as the job may run."""

    def __init__(self, redis: Redis | RedisCluster, gid: str, ttl: float) -> None:
        self._redis = redis
        self._key = memo_key(gid)
        self._ttl = max(1, round(ttl))
        self.handing_back = False

    async def recall(self) -> str | None:
        """Return the task a previous attempt created, if any."""
        value = await self._redis.get(self._key)
        return value.decode() if isinstance(value, bytes) else value

    async def keep(self, task: str) -> None:
        """Store the task id before anything else happens to it."""
        await self._redis.set(self._key, task, ex=self._ttl)


@dataclass(frozen=True, slots=True)
class Polled:
    """What a vendor says of a task, in our terms."""

    state: State
    # The run's own progress in [0, 1], if the vendor tells it.
    fraction: float | None = None
    # Where the results are (URLs, or data: URIs), once succeeded.
    results: tuple[str, ...] = ()
    # The public error of a failed task.
    code: str = FAILED


class VendorApi:
    """What every vendor's API object holds: its one HTTP session."""

    http: UpstreamHttp

    async def aclose(self) -> None:
        """Close the session."""
        await self.http.aclose()


class TaskApi(Protocol):
    """One vendor's task API: its requests and answers mapped to ours."""

    http: UpstreamHttp

    async def aclose(self) -> None:
        """Release the vendor's connections."""

    async def create(self, request: Request) -> str | Polled | list[Output]:
        """Create the task and return its id (or what a synchronous call made)."""

    async def poll(self, request: Request, task: str) -> Polled:
        """Read the task's state once; raise UpstreamError for a fault."""

    async def cancel(self, task: str) -> None:
        """Ask the vendor to stop the task (nothing where it cannot)."""


class TaskUpstream:
    """Run generations as vendor tasks, each created once and polled to the end."""

    def __init__(self, api: TaskApi) -> None:
        self.api = api

    def __repr__(self) -> str:
        return f"{type(self.api).__name__}({self.api.http.base_url!r})"

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Create (or recall) the task, follow it, download what it made."""
        task = await request.memo.recall()
        fresh = task is None
        if task is None:
            created = await self._create(request)
            if isinstance(created, list):
                await progress(running(1.0))
                return created
            if isinstance(created, Polled):
                return await self._results(request, created, progress)
            task = created
        try:
            if fresh:  # a cancel landing while it is kept still reaches the vendor
                await request.memo.keep(task)
            polled = await self._until_done(request, task, progress)
        except asyncio.CancelledError:
            if not request.memo.handing_back:
                await self._cancel(task)
            raise
        except Exception:  # refused or unreadable: stop paying for it
            await self._cancel(task)
            raise
        return await self._results(request, polled, progress)

    async def _create(self, request: Request) -> str | Polled | list[Output]:
        """Create the task; one canceled meanwhile is still told to stop or kept.

        A cancel that lands while the vendor is answering would otherwise lose
        the task's id, and the vendor would run (and bill) it anyway.
        """
        creating = asyncio.ensure_future(self.api.create(request))
        try:
            return await asyncio.shield(creating)
        except asyncio.CancelledError:
            await to_the_end(self._dispose(request, creating))
            raise

    async def _dispose(
        self, request: Request, creating: asyncio.Future[str | Polled | list[Output]]
    ) -> None:
        """Keep a task created after all for the next worker, or tell it to stop."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_SECONDS):
                created = await creating
            if isinstance(created, str):
                if request.memo.handing_back:  # the next worker polls it
                    await request.memo.keep(created)
                else:
                    await self._tell_to_cancel(created)

    async def _results(
        self, request: Request, polled: Polled, progress: Progress
    ) -> list[Output]:
        """Download what an ended task made (as many files as were paid for)."""
        if polled.state != "succeeded":
            raise UpstreamError(polled.code, transient=False)
        wanted = 1 if request.kind == "video" else request.count
        if len(polled.results) < wanted:
            raise UpstreamError(FAILED, transient=False)
        await progress(running(1.0))
        return [
            await fetch_result(self.api.http, url, request.kind)
            for url in polled.results[:wanted]
        ]

    async def _until_done(
        self, request: Request, task: str, progress: Progress
    ) -> Polled:
        """Poll until the task ends, passing its progress on."""
        wait = FIRST_POLL
        while True:
            polled = await self._polled(request, task)
            if polled.state in ("succeeded", "failed"):
                return polled
            if polled.state == "waiting":
                await progress(WAITING)
            else:
                await progress(running(polled.fraction))
            await asyncio.sleep(wait)
            wait = min(wait * 1.5, LONGEST_POLL)

    async def _polled(self, request: Request, task: str) -> Polled:
        """Poll once, retrying busy or unreachable moments in place."""
        delay = 1.0
        while True:
            try:
                return await self.api.poll(request, task)
            except UpstreamError as err:
                if not err.transient:
                    raise
                await asyncio.sleep(err.retry_after or delay)  # the deadline bounds it
                delay = min(delay * 2, 30.0)

    async def _cancel(self, task: str) -> None:
        """Tell the vendor to cancel, though the job is canceled again meanwhile."""
        await to_the_end(self._tell_to_cancel(task))

    async def _tell_to_cancel(self, task: str) -> None:
        """Tell the vendor to cancel; its answer changes nothing here."""
        with contextlib.suppress(Exception):
            async with asyncio.timeout(CANCEL_SECONDS):
                await self.api.cancel(task)

    async def aclose(self) -> None:
        """Close the vendor's connections."""
        await self.api.aclose()
