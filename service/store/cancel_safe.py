"""redis-py connections whose commands never swallow a task's cancellation.

redis-py sends a command under `asyncio.wait_for(write, socket_timeout)`. On
Python 3.11 `wait_for` returns the write's result when a cancel arrives just as
the write finishes, dropping the cancel (CPython gh-86296, fixed in 3.12): the
canceled task goes on. A worker's job then outlives its owner's cancel, a job
its deadline, a slot wait its caller's timeout. Such a connection notices the
dropped cancel, closes (a reply is still on its way) and raises it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.asyncio.cluster import RedisCluster
from redis.asyncio.connection import (
    AbstractConnection,
    Connection,
    SSLConnection,
    UnixDomainSocketConnection,
)


class _CancelSafe(AbstractConnection):
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
