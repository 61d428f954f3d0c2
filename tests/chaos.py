"""A TCP proxy in front of Redis that can go silent or slow: a sick server on demand."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable
from typing import TypeVar

from redis.asyncio import Redis

from service.store.connect import connect

from .ports import free_port

T = TypeVar("T")
# Past late_replies' 0.2 s socket timeout: the client gives the try up.
LATE_SECONDS = 0.6


class HangingProxy:
    """Relay to a target port; in `hang` mode accept and relay nothing, ever.

    With `delay` set, every reply reaches the client that many seconds late;
    with `marker` set, only the reply to the first request that holds it.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.hang = False
        self.delay = 0.0
        self.marker = b""
        self._late_next = 0.0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        """Return the redis:// URL of the proxy."""
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        """Listen on the proxy port."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def stop(self) -> None:
        """Close every connection and stop listening."""
        for writer in list(self._writers):
            writer.close()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._writers.add(writer)
        if self.hang:
            return  # accept, then never say a word
        up_reader, up_writer = await asyncio.open_connection(
            "127.0.0.1", self.target_port
        )
        self._writers.add(up_writer)
        await asyncio.gather(
            self._pump(reader, up_writer), self._pump(up_reader, writer, late=True)
        )

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        late: bool = False,
    ) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                if not late and self.marker and self.marker in data:
                    self.marker, self._late_next = b"", LATE_SECONDS
                if late and (self.delay or self._late_next):
                    delay, self._late_next = self.delay or self._late_next, 0.0
                    await asyncio.sleep(delay)
                if not self.hang:
                    writer.write(data)
                    await writer.drain()
        writer.close()


class Late:
    """Run an operation whose first try's reply comes after the socket timeout
    (Redis runs it); the client's one retry, on a new connection, is answered."""

    def __init__(self, proxy: HangingProxy) -> None:
        self._proxy = proxy

    async def __call__(self, operation: Awaitable[T], marker: bytes = b"") -> T:
        """Run it with its first try's reply late: every reply in its first
        0.1 s, or, given a marker, only the reply to the request holding it."""
        if marker:
            self._proxy.marker = marker
            return await operation
        self._proxy.delay = LATE_SECONDS
        running = asyncio.ensure_future(operation)
        await asyncio.sleep(0.1)  # the first try is out and has run
        self._proxy.delay = 0.0
        return await running


@contextlib.asynccontextmanager
async def late_replies(port: int) -> AsyncIterator[tuple[Redis, Late]]:
    """A store client with a 0.2 s socket timeout and one retry, through a
    proxy to the Redis on `port` that can delay its replies."""
    proxy = HangingProxy(port)
    await proxy.start()
    slow = connect(proxy.url, cluster=False, socket_timeout=0.2, connect_timeout=1)
    try:
        yield slow, Late(proxy)
    finally:
        await slow.aclose()
        await proxy.stop()
