"""The wire beside a store client's pool: pipelined, ordered, new after a failure."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator

import pytest
from redis.asyncio import Redis
from redis.exceptions import (
    AuthenticationError,
    ConnectionError as RedisConnectionError,
    NoScriptError,
    ResponseError,
    TimeoutError as RedisTimeout,
)

from service.store.connect import connect
from service.store.deadline import counted_from_send
from service.store.durable import DurableScripts
from service.store.embedded import RedisServer
from service.store.wire import Wire, wire_of

from .chaos import HangingProxy
from .ports import free_port


def _client(url: str) -> Redis:
    return connect(url, cluster=False, socket_timeout=1, connect_timeout=1)


def _wire(url: str, *, timeout: float = 1.0) -> Wire:
    client = connect(url, cluster=False, socket_timeout=timeout, connect_timeout=1)
    wire = Wire.for_client(client)
    assert wire is not None
    return wire


@contextlib.asynccontextmanager
async def _through_proxy(
    redis_server: RedisServer, *, socket_timeout: float = 1.0
) -> AsyncIterator[tuple[HangingProxy, Wire]]:
    """A wire to the server through a proxy that can swallow every byte."""
    proxy = HangingProxy(redis_server.port)
    await proxy.start()
    wire = _wire(proxy.url, timeout=socket_timeout)
    try:
        yield proxy, wire
    finally:
        await wire.aclose()
        await proxy.stop()


@pytest.fixture
async def wire(redis_server: RedisServer) -> AsyncIterator[Wire]:
    wire = _wire(redis_server.url)
    yield wire
    await wire.aclose()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(port=free_port()) as server:
        yield server


async def test_many_commands_in_flight_each_get_their_own_reply(wire: Wire) -> None:
    """Replies come back in the order the commands went out, to their senders."""
    words = [f"word-{n}".encode() for n in range(500)]
    replies = await asyncio.gather(*(wire.call("ECHO", word) for word in words))
    assert replies == words
    assert isinstance(await wire.call("INCRBY", "test:wire:n", 0), int)


class _CountingWire(Wire):
    """A wire that keeps every write it makes, and what a deadline heard then."""

    writes: list[bytes]

    def write_command(self, transport: asyncio.Transport, packed: bytes) -> None:
        self.writes.append(packed)
        super().write_command(transport, packed)


def _counting(url: str) -> _CountingWire:
    client = connect(url, cluster=False, socket_timeout=1, connect_timeout=1)
    pool = client.connection_pool
    wire = _CountingWire(pool.connection_kwargs)
    wire.writes = []
    return wire


async def test_a_crowd_of_commands_shares_one_write_after_the_first(
    redis_server: RedisServer,
) -> None:
    """Fifty calls started together are two system calls, not fifty: the first
    goes out at once on the idle connection, the others at the end of the turn
    in one write, with a `send` made in the same turn after them."""
    wire = _counting(redis_server.url)
    try:
        await wire.call("PING")  # opens the connection
        wire.writes.clear()
        words = [f"turn-{n}".encode() for n in range(50)]
        calls = [asyncio.ensure_future(wire.call("ECHO", word)) for word in words]
        await asyncio.sleep(0)  # each call has queued its command
        assert [w.count(b"ECHO") for w in wire.writes] == [1]
        last = wire.send("ECHO", b"after")
        assert last is not None
        assert [w.count(b"ECHO") for w in wire.writes] == [1, 50]
        assert await asyncio.gather(*calls) == words
        assert await last == b"after"
        pongs = await asyncio.gather(*(wire.call("PING") for _ in range(3)))
        assert pongs == [b"PONG"] * 3
        assert [w.count(b"PING") for w in wire.writes[2:]] == [1, 2]
    finally:
        await wire.aclose()


async def test_a_deadline_counts_a_corked_command_from_its_write(
    redis_server: RedisServer,
) -> None:
    """A command held for the end of its turn has not reached Redis yet: the
    deadline over it (counted_from_send) restarts when it is written."""
    wire = _counting(redis_server.url)
    told: list[int] = []

    class Heard:
        def sent(self) -> None:
            told.append(len(wire.writes))

    try:
        await wire.call("PING")
        first = asyncio.ensure_future(wire.call("PING"))  # out at once
        with counted_from_send(Heard()):  # type: ignore[arg-type]
            corked = asyncio.ensure_future(wire.call("PING"))
        await asyncio.sleep(0)
        assert (len(wire.writes), told) == (2, [])  # held, not written
        assert [await first, await corked] == [b"PONG", b"PONG"]
        assert told == [3]  # told once, right after the write that carried it
    finally:
        await wire.aclose()


async def test_commands_corked_on_a_dropped_connection_never_go_out(
    redis_server: RedisServer, redis: Redis
) -> None:
    """A drop before the turn's write fails the commands held for it, writes
    none of them, and the next call opens a new connection."""
    wire = _counting(redis_server.url)
    try:
        first = await wire.call("CLIENT", "ID")
        calls = [
            asyncio.ensure_future(wire.call("PING")),  # out at once
            asyncio.ensure_future(wire.call("INCR", "test:wire:never")),  # corked
        ]
        await asyncio.sleep(0)
        wire.drop()
        for call in calls:
            with pytest.raises(RedisTimeout):
                await call
        assert await wire.call("CLIENT", "ID") != first
        assert await redis.get("test:wire:never") is None
        assert not any(b"test:wire:never" in w for w in wire.writes)
    finally:
        await wire.aclose()


async def test_error_replies_raise_what_redis_py_raises(
    wire: Wire, redis: Redis
) -> None:
    """A missing script is NoScriptError (the limiter reloads on it); others are
    ResponseError, inside an array too; the connection goes on."""
    with pytest.raises(NoScriptError):
        await wire.call("EVALSHA", "0" * 40, 0)
    with pytest.raises(ResponseError, match="wrong number of arguments"):
        await wire.call("GET")
    reply = await wire.call("EVAL", "return {1, redis.error_reply('ERR inner'), 3}", 0)
    assert reply[0] == 1
    assert reply[2] == 3
    assert isinstance(reply[1], ResponseError)
    assert "inner" in str(reply[1])
    assert await wire.call("PING") == b"PONG"


async def test_it_authenticates_and_selects_its_database(
    own_redis: RedisServer,
) -> None:
    """A password and a database in the URL are used as redis-py uses them."""
    admin = Redis.from_url(own_redis.url)
    await admin.config_set("requirepass", "s3cret")
    try:
        wire = _wire(f"redis://:s3cret@127.0.0.1:{own_redis.port}/3")
        try:
            await wire.call("SET", "test:wire:db", "three")
        finally:
            await wire.aclose()
        third = Redis.from_url(f"redis://:s3cret@127.0.0.1:{own_redis.port}/3")
        assert await third.get("test:wire:db") == b"three"
        await third.aclose()
        wrong = _wire(f"redis://:nope@127.0.0.1:{own_redis.port}/0")
        with pytest.raises(AuthenticationError):
            await wrong.call("PING")
        await wrong.aclose()
    finally:
        reset = Redis.from_url(f"redis://:s3cret@127.0.0.1:{own_redis.port}/0")
        await reset.config_set("requirepass", "")
        await reset.aclose()
        await admin.aclose()


async def test_a_lost_server_fails_the_call_and_the_next_one_reconnects(
    own_redis: RedisServer,
) -> None:
    """No command waits on a dead connection; a restarted server is used at once."""
    wire = _wire(own_redis.url)
    try:
        assert await wire.call("PING") == b"PONG"
        own_redis.stop()
        with pytest.raises(RedisConnectionError):
            await wire.call("PING")
        own_redis.start()  # a new server: client ids start again
        assert await wire.call("PING") == b"PONG"
    finally:
        await wire.aclose()


async def test_a_dropped_connection_fails_its_waiting_commands_and_is_replaced(
    redis_server: RedisServer,
) -> None:
    """What the limiter does when a decision's deadline passes on the connection."""
    async with _through_proxy(redis_server) as (proxy, wire):
        first = await wire.call("CLIENT", "ID")
        proxy.hang = True  # every byte from now on is swallowed
        waiting = asyncio.ensure_future(wire.call("PING"))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        wire.drop()
        with pytest.raises(RedisTimeout):
            await waiting
        proxy.hang = False
        assert await wire.call("CLIENT", "ID") != first


async def test_a_connection_whose_oldest_command_is_overdue_is_replaced(
    redis_server: RedisServer,
) -> None:
    """Past the socket timeout the connection is dropped: the next command does
    not queue behind a hang."""
    async with _through_proxy(redis_server, socket_timeout=0.1) as (proxy, wire):
        first = await wire.call("CLIENT", "ID")
        proxy.hang = True
        abandoned = asyncio.ensure_future(wire.call("PING"))
        await asyncio.sleep(0.15)
        proxy.hang = False
        assert await wire.call("CLIENT", "ID") != first
        with pytest.raises(RedisTimeout):
            await abandoned


async def test_a_command_never_answered_times_out_with_none_after_it(
    redis_server: RedisServer,
) -> None:
    """The socket timeout holds for a lone command: no later command is needed
    to notice the hang; the connection is dropped and the next one is new."""
    async with _through_proxy(redis_server, socket_timeout=0.1) as (proxy, wire):
        first = await wire.call("CLIENT", "ID")
        proxy.hang = True
        started = time.perf_counter()
        with pytest.raises(RedisTimeout):
            await asyncio.wait_for(wire.call("PING"), 2)  # a builtin TimeoutError
        assert 0.1 <= time.perf_counter() - started < 1
        proxy.hang = False
        assert await wire.call("CLIENT", "ID") != first


def test_tls_and_cluster_clients_keep_redis_py() -> None:
    """Only a plain TCP or Unix socket server gets a wire of its own."""
    tls = connect("rediss://127.0.0.1:6380/0", cluster=False, socket_timeout=1,
                  connect_timeout=1)  # fmt: skip
    assert Wire.for_client(tls) is None
    nodes = connect("redis+cluster://127.0.0.1:7000", cluster=True, socket_timeout=1,
                    connect_timeout=1)  # fmt: skip
    assert Wire.for_client(nodes) is None
    unix = connect("unix:///tmp/redis.sock", cluster=False, socket_timeout=1,
                   connect_timeout=1)  # fmt: skip
    assert Wire.for_client(unix) is not None


async def test_a_client_connect_makes_has_a_wire_closed_with_it(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Money scripts go out on it; closing the client closes it; a bare client
    has none (its scripts keep redis-py)."""
    client = _client(redis_server.url)
    wire = wire_of(client)
    assert wire is not None
    bare = Redis.from_url(redis_server.url)
    assert wire_of(bare) is None  # no wire beside a pool connect did not make
    await bare.aclose()
    incr = client.register_script("return redis.call('INCR', KEYS[1])")
    before = await DurableScripts(client).run(incr, ["test:wire:money"], [])
    clients = int((await redis.info("clients"))["connected_clients"])
    await client.aclose()
    for _ in range(50):
        now = int((await redis.info("clients"))["connected_clients"])
        if now < clients:
            break
        await asyncio.sleep(0.01)
    assert now < clients
    assert int(await redis.get("test:wire:money") or 0) == before


async def test_a_script_is_loaded_again_after_a_flush(
    redis_server: RedisServer, redis: Redis
) -> None:
    """EVALSHA's NOSCRIPT after SCRIPT FLUSH loads the script and runs it once."""
    client = _client(redis_server.url)
    try:
        incr = client.register_script("return redis.call('INCR', KEYS[1])")
        durable = DurableScripts(client)
        first = await durable.run(incr, ["test:wire:flush"], [])
        await redis.script_flush()
        assert await durable.run(incr, ["test:wire:flush"], []) == first + 1
    finally:
        await client.aclose()


async def test_a_swallowed_script_times_out_and_is_retried_as_the_client_retries(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The socket timeout drops the connection; the client's one retry goes out on
    a new one; with no retry the caller gets the timeout."""
    proxy = HangingProxy(redis_server.port)
    await proxy.start()
    retried = connect(proxy.url, cluster=False, socket_timeout=0.1, connect_timeout=1)
    once = connect(
        proxy.url, cluster=False, socket_timeout=0.1, connect_timeout=1, retries=0
    )
    try:
        key = "test:wire:retried"
        incr = retried.register_script("return redis.call('INCR', KEYS[1])")
        await DurableScripts(retried).run(incr, [key], [])
        await DurableScripts(once).run(incr, [key], [])
        proxy.hang = True  # the next command is swallowed on its way
        running = asyncio.ensure_future(DurableScripts(retried).run(incr, [key], []))
        await asyncio.sleep(0.05)
        proxy.hang = False
        assert await running == 3  # the swallowed one never ran; its retry did
        proxy.hang = True
        with pytest.raises(RedisTimeout):
            await DurableScripts(once).run(incr, [key], [])
        proxy.hang = False
        assert int(await redis.get(key) or 0) == 3
    finally:
        await retried.aclose()
        await once.aclose()
        await proxy.stop()
