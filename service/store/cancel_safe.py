"""redis-py connections that keep a task's cancel and time out by Redis's clock.

Cancels: redis-py sends a command under `asyncio.wait_for(write,
socket_timeout)`. On Python 3.11 `wait_for` returns the write's result when a
cancel arrives just as the write finishes, dropping the cancel (CPython
gh-86296, fixed in 3.12): the canceled task goes on. A worker's job then
outlives its owner's cancel, a job its deadline, a slot wait its caller's
timeout. Such a connection notices the dropped cancel, closes (a reply is
still on its way) and raises it again.

Timeouts: redis-py times a reply and a connect with `asyncio.timeout`. When a
burst keeps the loop busy past the timeout, the reply and the expired timer
become ready together and the timer wins: a request answers 503 although Redis
answered in a millisecond. Such a connection times both with `patiently`
(deadline.py), which lets a reply that has arrived be read first. It also
tells a deadline over the call (`within`, the limiter's) when the command is
out, so that the deadline counts the peer's time from there.

Packing: redis-py's asyncio connections pack each command in Python (3.8 µs
for a limiter EVALSHA here); its synchronous ones use hiredis's C packer
(0.6 µs). Such a connection packs with hiredis too, as the synchronous client
does, and leaves an argument hiredis refuses to redis-py's own packer (and its
DataError).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from typing import Any

import hiredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)
from redis.exceptions import TimeoutError as RedisTimeout
from redis.typing import EncodableT

from .deadline import patiently, request_sent


class _CancelSafe(AbstractConnection):
    def pack_command(self, *args: EncodableT) -> list[bytes]:
        """Pack as redis-py's synchronous client does, with hiredis's C packer."""
        first, rest = args[0], args[1:]
        words: tuple[Any, ...] = args
        if isinstance(first, str):  # "CONFIG GET" is two arguments
            words = (*first.encode().split(), *rest)
        elif isinstance(first, bytes) and b" " in first:
            words = (*first.split(), *rest)
        try:
            return [hiredis.pack_command(words)]
        except TypeError:  # None, a bool, a bytearray: redis-py's rules and errors
            return super().pack_command(*args)

    async def send_packed_command(
        self, command: bytes | str | Iterable[bytes], check_health: bool = True
    ) -> None:
        """Send as redis-py does; raise a cancel that arrived during the send."""
        task = asyncio.current_task()
        cancels = task.cancelling() if task is not None else 0
        await super().send_packed_command(command, check_health)
        if task is not None and task.cancelling() > cancels:
            await self.disconnect(nowait=True)
            raise asyncio.CancelledError
        request_sent()  # a deadline over this call counts the peer's time from here

    async def read_response(
        self,
        disable_decoding: bool = False,
        timeout: float | None = None,  # noqa: ASYNC109 (redis-py's signature)
        *,
        disconnect_on_error: bool = True,
        push_request: bool | None = False,
    ) -> Any:
        """Read as redis-py does; time the socket timeout by Redis's clock."""
        if timeout is not None or not self.socket_timeout:
            return await super().read_response(
                disable_decoding,
                timeout,
                disconnect_on_error=disconnect_on_error,
                push_request=push_request,
            )
        try:
            with patiently(self.socket_timeout):
                # math.inf: redis-py's own timer off; a cancel disconnects.
                return await super().read_response(
                    disable_decoding,
                    math.inf,
                    disconnect_on_error=disconnect_on_error,
                    push_request=push_request,
                )
        except TimeoutError:
            raise RedisTimeout(f"Timeout reading from {self._host_error()}") from None

    async def _connect(self) -> None:
        """Open the socket as redis-py does; time it by the peer's clock.

        redis-py's connect retries and errors wrap this one step, so a late
        TimeoutError here is retried and reported as redis-py's own would be.
        """
        limit = self.socket_connect_timeout
        if not limit:
            await super()._connect()  # type: ignore[safe-super,no-untyped-call]
            return
        self.socket_connect_timeout = None  # redis-py's own timer off
        try:
            with patiently(limit):
                await super()._connect()  # type: ignore[safe-super,no-untyped-call]
        finally:
            self.socket_connect_timeout = limit


class CancelSafeConnection(_CancelSafe, Connection):
    """A plain TCP connection (redis://)."""


class CancelSafeSSLConnection(_CancelSafe, SSLConnection):
    """A TLS connection (rediss://)."""


class CancelSafeUnixConnection(_CancelSafe, UnixDomainSocketConnection):
    """A Unix socket connection (unix://)."""


def cancel_safe_class(
    connection_class: type[AbstractConnection],
) -> type[AbstractConnection]:
    """The cancel-safe counterpart of the class redis-py chose for a URL."""
    if issubclass(connection_class, SSLConnection):
        return CancelSafeSSLConnection
    if issubclass(connection_class, UnixDomainSocketConnection):
        return CancelSafeUnixConnection
    return CancelSafeConnection


def make_cluster_cancel_safe(cluster: RedisCluster) -> None:
    """Give every node of a cluster client, known now or found later, such connections.

    The cluster client picks its connection class itself; nodes it discovers
    are made from its shared connection arguments, as redis-py's own
    maintenance handler amends them.
    """
    options: dict[str, Any] = cluster.nodes_manager.connection_kwargs
    options["connection_class"] = cancel_safe_class(options["connection_class"])
    for node in cluster.nodes_manager.startup_nodes.values():
        node.connection_class = options["connection_class"]
