"""A pub/sub subscription that outlives its connection, and on a cluster its node."""

from __future__ import annotations

import contextlib
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import ConnectionError, RedisClusterException, RedisError

from .connect import is_cluster


class Subscriber:
    """Keep a set of channels subscribed; after a failure, subscribe afresh.

    On Redis Cluster a PUBLISH reaches every node, replicas included, so any
    node will do; redis-py's cluster pub/sub stays on the node it first picked
    even after that node died, so each failure moves the subscription to the
    next node of the cluster. Messages published while no node listens are
    lost, as pub/sub always allows: callers only relay live events.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._channels: set[str] = set()
        self._pubsub: PubSub | None = None  # made on first use, again after a failure
        self._moves = 0

    async def subscribe(self, *channels: str) -> None:
        """Add channels; subscribed when this returns (or it raises)."""
        self._channels.update(channels)
        if self._pubsub is None:
            await self._reopen()
            return
        try:
            await self._pubsub.subscribe(*channels)
        except (RedisError, OSError):
            await self._drop()
            raise

    async def unsubscribe(self, *channels: str) -> None:
        """Drop channels."""
        self._channels.difference_update(channels)
        if self._pubsub is not None:
            await self._pubsub.unsubscribe(*channels)

    async def get_message(self, timeout: float) -> dict[str, Any] | None:  # noqa: ASYNC109 (redis-py's name)
        """Return the next message or None; a failure raises once, then recovers."""
        if self._pubsub is None:
            await self._reopen()
        assert self._pubsub is not None
        try:
            message = await self._pubsub.get_message(timeout=timeout)
        except (RedisError, OSError):
            await self._drop()
            raise
        return cast(dict[str, Any] | None, message)

    async def _drop(self) -> None:
        if self._pubsub is not None:
            with contextlib.suppress(RedisError, OSError):
                await self._pubsub.aclose()  # type: ignore[no-untyped-call]
            self._pubsub = None

    async def _reopen(self) -> None:
        await self._drop()
        pubsub = await self._fresh()
        try:
            if self._channels:
                await pubsub.subscribe(*self._channels)
        except (RedisError, OSError):
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[no-untyped-call]
            raise
        self._pubsub = pubsub

    async def _fresh(self) -> PubSub:
        if not is_cluster(self._redis):
            return self._redis.pubsub(ignore_subscribe_messages=True)
        cluster = cast(RedisCluster, self._redis)
        try:  # a node must be named: the slot map may be empty until initialized
            await cluster.initialize()
        except RedisClusterException as err:  # no node answered: not a RedisError
            raise ConnectionError(str(err)) from err
        nodes = cluster.get_nodes()
        node = nodes[self._moves % len(nodes)]
        self._moves += 1
        return cluster.pubsub(node=node, ignore_subscribe_messages=True)

    async def aclose(self) -> None:
        """Close the connection."""
        self._channels.clear()
        await self._drop()
