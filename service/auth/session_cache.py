"""Sessions read in the last seconds, dropped the moment any process ends one.

Every session route reads its session, so a person clicking through the
workbench would cost a Redis round trip per request. Instead each app process
keeps the sessions it has read for a few seconds. Every end of a session (the
`_END` script: logout, sign out everywhere, revoke) is published on one channel
that each process listens to, and the process that ended it drops it at once.
The cache is used only while the listener is subscribed: losing the
subscription empties it, so a missed notice never keeps an ended session alive.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..store.pubsub import Subscriber

ENDED_CHANNEL: Final = "studio:sessions:ended"
FRESH_SECONDS: Final = 5.0
MAX_ENTRIES: Final = 10_000
SHUTDOWN_SECONDS: Final = 2.0
_LOGGER: Final = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Session:
    """A signed-in person's session, as Redis keeps it."""

    key: str
    account_id: str
    created: int
    seen: int


class SessionCache:
    """Sessions by key, fresh for FRESH_SECONDS, only while ends are heard."""

    def __init__(self) -> None:
        self._entries: OrderedDict[str, tuple[float, Session]] = OrderedDict()
        self.listening = False
        # Bumped by every end: a read that raced an end is not kept.
        self.epoch = 0

    def get(self, key: str) -> Session | None:
        """Return a fresh copy of a session, if this process read it lately."""
        entry = self._entries.get(key)
        if entry is None:
            return None
        if time.monotonic() - entry[0] > FRESH_SECONDS or not self.listening:
            del self._entries[key]
            return None
        return entry[1]

    def put(self, session: Session, epoch: int) -> None:
        """Keep a session read from Redis, unless some session ended meanwhile."""
        if not self.listening or epoch != self.epoch:
            return
        self._entries[session.key] = (time.monotonic(), session)
        self._entries.move_to_end(session.key)
        if len(self._entries) > MAX_ENTRIES:
            self._entries.popitem(last=False)

    def drop(self, key: str) -> None:
        """Forget a session that has ended."""
        self.epoch += 1
        self._entries.pop(key, None)

    def clear(self) -> None:
        """Forget everything: ends may have gone unheard."""
        self.epoch += 1
        self._entries.clear()

    async def listen(self, redis: Redis, stop: asyncio.Event) -> None:
        """Drop every session any process ends, until `stop` is set."""
        pubsub = Subscriber(redis)  # survives a lost node on Redis Cluster
        try:
            while not stop.is_set():
                try:
                    await pubsub.subscribe(ENDED_CHANNEL)
                    self.listening = True
                    while not stop.is_set():
                        message = await pubsub.get_message(timeout=1.0)
                        if message and message["type"] == "message":
                            self.drop(_text(message["data"]))
                except (RedisError, OSError) as err:
                    self.listening = False
                    self.clear()
                    _LOGGER.warning("session ends channel: %s", type(err).__name__)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), 1.0)
        finally:
            self.listening = False
            self.clear()
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()


def _text(data: bytes | str) -> str:
    return data.decode() if isinstance(data, bytes) else data
