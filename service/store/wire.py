"""One pipelined Redis connection beside a client's pool, for the hot scripts.

A command through redis-py's asyncio client costs about 60 µs of CPU here: a
connection taken from the pool and given back, a task and a timer for the
write (`asyncio.wait_for`), a deadline for the read, a stream reader. The
same command written on an asyncio protocol whose replies hiredis parses as
they arrive costs about 11. So every client `connect` makes for a single
server over TCP or a Unix socket keeps one (`WiredPool`): the limiter's
decisions, the money scripts (durable.py) and the job queue's scripts go out
on it; everything else, and TLS and Redis Cluster, keep redis-py.

Commands go out in order on one connection and their replies come back in
the same order, so any number may be in flight. A command `call` is given
while others are still waiting for their replies goes out with the rest of
its turn at the turn's end, in one write: each write saved a submit 14-29 µs
of CPU here (the kernel's send on loopback, and Redis woken on the other
core), and 50 signed-in clients' submits share a turn several at a time. A
command on an idle connection goes out at once.

A connection that breaks fails every command on it. One whose oldest command
has waited longer than the socket timeout (a hung server) is dropped, with a
timeout for every command on it: one timer a connection watches the oldest
command (the limiter keeps shorter deadlines of its own). The next command
opens a new connection; `run_script` retries as the client retries.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any, Final, cast

import hiredis
from redis.asyncio import Redis
from redis.asyncio.connection import (
    BlockingConnectionPool,
    ConnectionPool,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import (
    AuthenticationError,
    ConnectionError as RedisConnectionError,
    NoScriptError,
    ResponseError,
    TimeoutError as RedisTimeout,
)

from .deadline import Deadline, patiently, sent_callback

# A connect with no timeout configured still gives up after this long.
DEFAULT_CONNECT_SECONDS: Final = 5.0


async def _ignore(error: Exception) -> None:
    """What a retry does before it tries again: nothing (a new connection)."""


def _reply_error(message: str) -> ResponseError:
    """Turn an error reply into the exception redis-py would raise for it."""
    if message.startswith("NOSCRIPT"):
        return NoScriptError(message.removeprefix("NOSCRIPT "))
    return ResponseError(message)


class _Replies(asyncio.Protocol):
    """Hand each reply, as hiredis completes it, to the oldest command waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # Its loop, kept: Python 3.11's get_running_loop is a getpid system call.
        self.loop = loop
        self.reader = hiredis.Reader(replyError=_reply_error)
        # (loop time the command went out, its future), oldest first
        self.waiting: deque[tuple[float, asyncio.Future[Any]]] = deque()
        self.transport: asyncio.Transport | None = None
        self.lost = False
        # Commands of this turn not yet written, and whom to tell when they are.
        self.corked: list[bytes] = []
        self.on_write: list[Callable[[], None]] = []
        # The socket timeout's timer over the oldest command waiting (Wire._watch).
        self.watchdog: Deadline | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Keep the transport to write on (uvloop's is not an asyncio.Transport)."""
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        """Parse what came; resolve a command per whole reply."""
        self.reader.feed(data)
        while (reply := self.reader.gets()) is not False:
            if not self.waiting:  # a reply nobody asked for: the stream is lost
                assert self.transport is not None
                self.transport.abort()
                return
            _, future = self.waiting.popleft()
            if future.done():
                continue  # its caller gave up; the reply is read and dropped
            if isinstance(reply, Exception):
                future.set_exception(reply)
            else:
                future.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        """Fail every command still waiting: no reply will come on this one."""
        self.lost = True
        self.fail(RedisConnectionError(f"connection to Redis lost: {exc or 'closed'}"))

    def unwatch(self) -> None:
        """Stop the socket timeout's timer: the connection is given up."""
        if self.watchdog is not None:
            self.watchdog.cancel()
            self.watchdog = None

    def fail(self, error: Exception) -> None:
        """Give every waiting command this error."""
        while self.waiting:
            _, future = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)


class Wire:
    """A lazily opened, pipelined connection to one Redis server."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        self._host = options.get("host", "localhost")
        self._port = int(options.get("port", 6379))
        self._path: str | None = options.get("path")
        self._username: str | None = options.get("username")
        self._password: str | None = options.get("password")
        self._db = int(options.get("db") or 0)
        self._timeout: float | None = options.get("socket_timeout")
        self._connect_timeout = float(
            options.get("socket_connect_timeout") or DEFAULT_CONNECT_SECONDS
        )
        self._retry: Retry = options.get("retry") or Retry(NoBackoff(), 0)
        self._replies: _Replies | None = None
        self._opening = asyncio.Lock()

    @classmethod
    def for_client(cls, redis: Redis) -> Wire | None:
        """Reach a redis-py client's server; None where it cannot (TLS, Cluster)."""
        pool = _pool(redis)
        if pool is None:
            return None
        return cls.for_pool(pool.connection_class, pool.connection_kwargs)

    @classmethod
    def for_pool(cls, kind: type[Any], options: Mapping[str, Any]) -> Wire | None:
        """Reach the server a pool's connections reach; None over TLS."""
        if issubclass(kind, SSLConnection):
            return None
        if issubclass(kind, UnixDomainSocketConnection) and not options.get("path"):
            return None
        return cls(options)

    async def run_script(
        self, sha: str, source: Any, keys: Sequence[str], args: Sequence[Any]
    ) -> Any:
        """Run a Lua script as a store's client would: EVALSHA, loading it once
        more after a SCRIPT FLUSH, within the socket timeout, retried as the
        client retries (a timeout drops the connection first)."""

        async def once() -> Any:
            command = ("EVALSHA", sha, len(keys), *keys, *args)
            try:
                return await self.call(*command)
            except NoScriptError:
                await self.call("SCRIPT", "LOAD", source)
                return await self.call(*command)

        # A timeout is the watchdog's (_watch): the connection is dropped, and
        # the retry goes out on a new one.
        return await self._retry.call_with_retry(once, _ignore)

    async def call(self, *args: Any) -> Any:
        """Send one command with the others of this turn; return its reply (an
        error reply is raised)."""
        if (future := self._queue(args, sent_callback())) is None:
            await self._open()
            future = self._queue(args, sent_callback())
            assert future is not None  # a connection just opened is current
        return await future

    def send(self, *args: Any) -> asyncio.Future[Any] | None:
        """Write one command now (after the turn's others), on a connection
        already open and current.

        Return the future of its reply (an error reply is its exception), or
        None, with nothing written, where a connection must be opened first.
        """
        if (replies := self._current()) is None:
            return None
        future = self._waiting(replies)
        self._write(replies, hiredis.pack_command(args))
        return future

    def _queue(
        self, args: tuple[Any, ...], on_write: Callable[[], None] | None
    ) -> asyncio.Future[Any] | None:
        """Write one command now if the connection is idle, else cork it until
        the end of the turn; None where a connection must be opened first.

        As Nagle's algorithm, but for a turn: Redis starts on the first command
        of a burst while the rest are gathered, so a lone caller waits no
        longer than before and a crowd shares one write.
        """
        if (replies := self._current()) is None:
            return None
        idle = not replies.waiting
        future = self._waiting(replies)
        if on_write is not None:
            replies.on_write.append(on_write)
        packed = hiredis.pack_command(args)
        if idle:
            self._write(replies, packed)
            return future
        if not replies.corked:
            replies.loop.call_soon(self._uncork, replies)
        replies.corked.append(packed)
        return future

    def _current(self) -> _Replies | None:
        """The open connection, unless it is lost (a hung one the watchdog drops:
        after a stall, replies may be waiting unread in its socket)."""
        replies = self._replies
        if replies is None or replies.lost:
            return None
        return replies

    def _waiting(self, replies: _Replies) -> asyncio.Future[Any]:
        """A future for the next reply on the connection, oldest first."""
        future: asyncio.Future[Any] = replies.loop.create_future()
        replies.waiting.append((replies.loop.time(), future))
        if replies.watchdog is None and self._timeout is not None:
            self._watch(replies)
        return future

    def _watch(self, replies: _Replies) -> None:
        """Time the oldest command waiting: one timer a connection, not one a
        command (a timer and a task's cancel scope cost a script run about
        6 µs of CPU here)."""
        assert self._timeout is not None
        due = replies.waiting[0][0] + self._timeout
        left = max(0.0, due - replies.loop.time())
        # The seconds are Redis's (deadline.py): after a stall, a reply that
        # came meanwhile is read before the verdict.
        replies.watchdog = Deadline(left, partial(self._overdue, replies))

    def _overdue(self, replies: _Replies) -> None:
        """Drop a connection whose oldest command is past the socket timeout;
        else time the one that is oldest now."""
        replies.watchdog = None
        if replies.lost or not replies.waiting:
            return
        assert self._timeout is not None
        if replies.loop.time() - replies.waiting[0][0] >= self._timeout:
            self._drop(replies)  # its reply is late, and every later one behind it
        else:
            self._watch(replies)

    def _uncork(self, replies: _Replies) -> None:
        """Write the turn's commands at once (a lost connection failed them)."""
        if replies.corked and not replies.lost:
            self._write(replies, b"")
        replies.corked.clear()
        replies.on_write.clear()

    def _write(self, replies: _Replies, packed: bytes) -> None:
        """Put the turn's corked commands on the wire, then these bytes."""
        assert replies.transport is not None
        if replies.corked:
            packed = b"".join([*replies.corked, packed])
            replies.corked.clear()
        self.write_command(replies.transport, packed)
        told, replies.on_write = replies.on_write, []
        for on_write in told:
            on_write()  # a deadline over that call counts Redis's time from here

    def write_command(self, transport: asyncio.Transport, packed: bytes) -> None:
        """Put one packed command on the wire: the one place a command goes out."""
        transport.write(packed)

    async def _open(self) -> _Replies:
        """Open a new connection in place of a lost one (once for all waiting)."""
        async with self._opening:
            current = self._replies
            if current is not None and not current.lost:
                return current  # opened by a command that waited here first
            self._replies = await self._connect()
            return self._replies

    def drop(self) -> None:
        """Give up on the connection: a caller's deadline passed on it.

        Its replies are late or lost; the commands still waiting on it fail,
        and the next command opens a new connection rather than queue behind
        them.
        """
        if self._replies is not None:
            self._drop(self._replies)

    def _drop(self, replies: _Replies) -> None:
        replies.lost = True
        replies.unwatch()
        replies.fail(RedisTimeout("Redis did not answer in time"))
        if replies.transport is not None:
            replies.transport.abort()

    async def _connect(self) -> _Replies:
        loop = asyncio.get_running_loop()
        protocol = partial(_Replies, loop)
        try:
            with patiently(self._connect_timeout):
                if self._path:
                    _, replies = await loop.create_unix_connection(protocol, self._path)
                else:
                    _, replies = await loop.create_connection(
                        protocol, self._host, self._port
                    )
                await self._hello(replies)
        except TimeoutError:
            raise RedisTimeout("Timeout connecting to Redis") from None
        except OSError as err:
            raise RedisConnectionError(f"cannot connect to Redis: {err}") from err
        return replies

    async def _hello(self, replies: _Replies) -> None:
        """Authenticate and select the database, as redis-py does on connect."""
        commands: list[tuple[Any, ...]] = []
        if self._password is not None:
            user = (self._username,) if self._username else ()
            commands.append(("AUTH", *user, self._password))
        if self._db:
            commands.append(("SELECT", self._db))
        if not commands:
            return
        futures = [self._waiting(replies) for _ in commands]
        self._write(replies, b"".join(hiredis.pack_command(c) for c in commands))
        for command, future in zip(commands, futures, strict=True):
            try:
                await future
            except ResponseError as err:
                for later in futures:
                    later.cancel()
                replies.unwatch()
                assert replies.transport is not None
                replies.transport.abort()
                if command[0] == "AUTH":
                    raise AuthenticationError(str(err)) from err
                raise RedisConnectionError(f"Redis refused SELECT: {err}") from err

    async def aclose(self) -> None:
        """Close the connection; commands still waiting fail."""
        if (replies := self._replies) is not None:
            replies.unwatch()
            if replies.transport is not None:
                replies.transport.close()
        self._replies = None


class WiredPool(ConnectionPool):
    """redis-py's pool with one wire to the same server beside it, closed with it.

    A client `connect` makes has one: its money scripts (store/durable.py) and
    the limiter's decisions go out on it, every other command through the pool.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.wire = Wire.for_pool(self.connection_class, self.connection_kwargs)

    async def disconnect(self, inuse_connections: bool = True) -> None:
        """Close the pool's connections and the wire's."""
        await super().disconnect(inuse_connections)
        if self.wire is not None:
            await self.wire.aclose()


class WiredBlockingPool(WiredPool, BlockingConnectionPool):
    """The same, for a pool that makes callers wait for a free connection."""


async def run_script(
    wire: Wire | None, script: AsyncScript, keys: Sequence[str], args: Sequence[Any]
) -> Any:
    """Run a registered script on a wire if there is one, else through redis-py."""
    if wire is None:
        return await script(keys=keys, args=args)
    return await wire.run_script(script.sha, script.script, keys, args)


def wire_of(redis: Redis) -> Wire | None:
    """Return the wire beside a client's pool, or None (TLS, Cluster, a bare client)."""
    pool = _pool(redis)
    return pool.wire if isinstance(pool, WiredPool) else None


def _pool(redis: Redis) -> ConnectionPool | None:
    """A single server's pool; a cluster client (typed as Redis here) has none."""
    pool = getattr(redis, "connection_pool", None)
    return pool if isinstance(pool, ConnectionPool) else None
