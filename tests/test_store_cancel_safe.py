"""A task canceled while redis-py sends its command is canceled (cancel_safe.py)."""

from __future__ import annotations

import asyncio
import random

from redis.asyncio import Redis

from service.store.cancel_safe import (
    CancelSafeConnection,
    CancelSafeSSLConnection,
    CancelSafeUnixConnection,
)
from service.store.connect import connect
from service.store.embedded import RedisServer

# Enough cancels that some land as a write finishes: plain redis-py on
# Python 3.11 loses one within the first few dozen.
CANCELS = 1000


async def _ping_forever(redis: Redis) -> None:
    while True:
        await redis.ping()


async def test_a_thousand_cancels_at_random_moments_each_stop_their_task(
    redis_server: RedisServer,
) -> None:
    """No cancel is dropped, and the connection answers each command its own reply."""
    redis = connect(
        redis_server.url, cluster=False, socket_timeout=5, connect_timeout=5
    )
    rng = random.Random(7)
    try:
        for attempt in range(CANCELS):
            task = asyncio.ensure_future(_ping_forever(redis))
            await asyncio.sleep(rng.uniform(0.0, 0.003))
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=2)
            assert done, f"cancel {attempt} was dropped: the task ran on"
            assert task.cancelled()
        replies = await asyncio.gather(*(redis.echo(str(n)) for n in range(200)))
        assert replies == [str(n).encode() for n in range(200)]
    finally:
        await redis.aclose()


def test_every_url_scheme_gets_its_cancel_safe_connection(
    redis_server: RedisServer,
) -> None:
    """redis://, rediss:// and unix:// each keep their transport."""
    cases = {
        redis_server.url: CancelSafeConnection,
        redis_server.url.replace("redis://", "rediss://"): CancelSafeSSLConnection,
        "unix:///run/redis.sock": CancelSafeUnixConnection,
    }
    for url, expected in cases.items():
        client = connect(url, cluster=False, socket_timeout=1, connect_timeout=1)
        assert client.connection_pool.connection_class is expected, url
