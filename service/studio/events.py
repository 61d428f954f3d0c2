"""Live events: one pub/sub connection per process fans account channels out to SSE."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any, Final

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..store.pubsub import Subscriber
from .ledger import events_channel, text

_LOGGER: Final = logging.getLogger(__name__)
# An event stream that falls this far behind is closed; its browser reconnects.
QUEUE_SIZE: Final = 256
# A closed stream's queue receives this, then nothing more.
CLOSE: Final[dict[str, Any]] = {"event": "_close"}


class EventHub:
    """Subscribe to an account's channel while at least one of its streams is open.

    Workers and app processes on any machine publish to `studio:events:<id>`
    (from inside the scripts that change the state); every app process holding
    a stream of that account relays it.
    """

    def __init__(self, redis: Redis) -> None:
        self._pubsub = Subscriber(redis)
        self._streams: dict[str, set[asyncio.Queue[dict[str, Any]]]] = {}
        self._reader: asyncio.Task[None] | None = None
        self._closed = False

    async def open(self, account_id: str) -> asyncio.Queue[dict[str, Any]]:
        """Start receiving an account's events; subscribed before this returns."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE_SIZE)
        streams = self._streams.setdefault(account_id, set())
        streams.add(queue)
        if len(streams) == 1:
            try:
                await self._pubsub.subscribe(events_channel(account_id))
            except BaseException:
                self.close_stream(account_id, queue)
                raise
        if self._reader is None or self._reader.done():
            self._reader = asyncio.create_task(self._read(), name="event-hub")
        return queue

    def close_stream(
        self, account_id: str, queue: asyncio.Queue[dict[str, Any]]
    ) -> None:
        """Stop relaying to one stream; unsubscribe once the account has none."""
        streams = self._streams.get(account_id)
        if streams is None:
            return
        streams.discard(queue)
        if not streams:
            del self._streams[account_id]
            if not self._closed:
                task = asyncio.ensure_future(self._unsubscribe(account_id))
                task.add_done_callback(_ignore)

    async def _unsubscribe(self, account_id: str) -> None:
        if account_id not in self._streams:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.unsubscribe(events_channel(account_id))

    def signal(self, account_id: str, event: dict[str, Any]) -> None:
        """Deliver an event of this process (a logout) to an account's streams."""
        for queue in list(self._streams.get(account_id, ())):
            self._put(account_id, queue, event)

    def _put(
        self,
        account_id: str,
        queue: asyncio.Queue[dict[str, Any]],
        event: dict[str, Any],
    ) -> None:
        try:
            queue.put_nowait(event)
        except asyncio.QueueFull:
            self.close_stream(account_id, queue)
            with contextlib.suppress(asyncio.QueueEmpty):
                queue.get_nowait()
            queue.put_nowait(CLOSE)

    async def _read(self) -> None:
        while self._streams and not self._closed:
            try:
                message = await self._pubsub.get_message(timeout=1.0)
            except (RedisError, OSError) as err:
                _LOGGER.warning("event hub: %s", type(err).__name__)
                await asyncio.sleep(1.0)
                continue
            if not message or message["type"] != "message":
                continue
            channel = text(message["channel"])
            account_id = channel.rpartition(":")[2]
            try:
                event = json.loads(message["data"])
            except ValueError:
                continue
            for queue in list(self._streams.get(account_id, ())):
                self._put(account_id, queue, event)

    async def aclose(self) -> None:
        """End every stream (shutdown) and close the connection."""
        self._closed = True
        for streams in self._streams.values():
            for queue in streams:
                with contextlib.suppress(asyncio.QueueFull):
                    queue.put_nowait(CLOSE)
        self._streams.clear()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, RedisError, OSError):
                await self._reader
        with contextlib.suppress(RedisError, OSError):
            await self._pubsub.aclose()


# How far along a generation's states are (every other state is an end).
_RANK: Final = {"queued": 0, "running": 1}


class Furthest:
    """The furthest state each generation of a stream was shown in.

    A stream subscribes before it reads its opening snapshot, so an event
    published just before that read can arrive after it: the generation would
    seem to go back (running, then queued). States and progress only move
    forward, so such a stale event is not sent.
    """

    def __init__(self) -> None:
        self._shown: dict[str, tuple[int, float]] = {}

    def newer(self, generation: dict[str, Any]) -> bool:
        """Tell whether this view is not behind what the stream already showed."""
        gid = generation.get("id")
        if not isinstance(gid, str):
            return True
        try:
            progress = float(generation.get("progress") or 0)
        except (TypeError, ValueError):
            progress = 0.0
        mark = (_RANK.get(str(generation.get("status")), 2), progress)
        shown = self._shown.get(gid)
        if shown is not None and mark < shown:
            return False
        self._shown[gid] = mark
        return True


def _ignore(task: asyncio.Future[None]) -> None:
    if not task.cancelled():
        task.exception()
