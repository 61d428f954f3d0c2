"""The service's redis-py connections: cancels are kept, hiredis packs."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

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


def test_commands_are_packed_byte_for_byte_as_redis_py_packs_them() -> None:
    """hiredis's packer is only faster: the bytes on the wire are redis-py's."""
    ours, theirs = CancelSafeConnection(), Connection()
    commands: list[tuple[Any, ...]] = [
        ("EVALSHA", "a" * 40, 1, "studio:rl:v1:{ip-1}:gallery", "", 10**8, 600, 1),
        ("CONFIG GET", "maxmemory"),
        (b"CLIENT SETNAME", b"worker"),
        ("SET", "k", "流光 é", "PX", 1500),
        ("SET", "k", 0.1 + 0.2),
        ("SET", "k", -(2**70)),
        ("SET", "k", memoryview(b"\x00\xffraw")),
        ("XADD", "s", "*", "b", b"x" * 100_000),
    ]
    for command in commands:
        assert b"".join(ours.pack_command(*command)) == b"".join(
            theirs.pack_command(*command)
        ), command
    # hiredis packs a command into one buffer; redis-py splits a large one
    large = commands[-1]
    assert len(ours.pack_command(*large)) == 1 < len(theirs.pack_command(*large))


def test_an_argument_hiredis_refuses_gets_redis_pys_own_error() -> None:
    """None, a bool, or an object: redis-py's DataError, not hiredis's TypeError."""
    ours = CancelSafeConnection()
    bad_values: list[Any] = [None, True, object()]
    for bad in bad_values:
        with pytest.raises(DataError, match="Invalid input of type"):
            ours.pack_command("SET", "k", bad)
    assert ours.pack_command("SET", "k", bytearray(b"ab")) == Connection().pack_command(
        "SET", "k", bytearray(b"ab")
    )


async def test_values_packed_by_hiredis_come_back_from_redis_unchanged(
    redis_server: RedisServer,
) -> None:
    """Text, bytes, numbers and a large value, written and read on a real Redis."""
    redis = connect(
        redis_server.url, cluster=False, socket_timeout=5, connect_timeout=5
    )
    values: dict[str, bytes | str | int | float] = {
        "text": "流光 é",
        "bytes": b"\x00\xff" * 50_000,
        "int": -(2**62),
        "float": 0.1 + 0.2,
    }
    try:
        for key, value in values.items():
            await redis.set(f"pack:{key}", value)
        got = await redis.mget([f"pack:{key}" for key in values])
        assert got == [
            value.encode()
            if isinstance(value, str)
            else value
            if isinstance(value, bytes)
            else repr(value).encode()
            for value in values.values()
        ]
    finally:
        await redis.aclose()
