"""A busy event loop is not a slow Redis: replies that came in are used, hangs fail."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

import pytest
from redis.asyncio import Connection, Redis
from redis.exceptions import TimeoutError as RedisTimeout

from service.limits.limiter import (
    DECISION_BUDGET_SECONDS,
    Limiter,
    LimiterUnavailable,
    Policy,
)
from service.store.cancel_safe import CancelSafeConnection
from service.store.connect import connect
from service.store.deadline import PATIENCE, SETTLE_SECONDS, patiently, within
from service.store.embedded import MailCatcher, RedisServer
from service.store.wire import Wire

from .chaos import HangingProxy
from .conftest import Client, collector_paused

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = pytest.mark.timing

# Longer than a decision's budget, so the deadline falls inside the stall.
STALL = 1.5 * DECISION_BUDGET_SECONDS
POLICY = Policy("lateness", 100_000, 60, 50_000)
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


def _loop_factories() -> list[Any]:
    """Run on asyncio's loop and on uvloop (production's), which runs timers first."""
    factories = [pytest.param(asyncio.new_event_loop, id="asyncio")]
    with contextlib.suppress(ImportError):
        import uvloop

        factories.append(pytest.param(uvloop.new_event_loop, id="uvloop"))
    return factories


def _run(factory: LoopFactory, main: Coroutine[Any, Any, None]) -> None:
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main)


def _address() -> str:
    return f"busy-{uuid.uuid4().hex[:10]}@example.com"


def _busy(seconds: float) -> None:
    """Keep the CPU, and so the event loop, busy: what heavy request work does."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _stalling_after_write(stalls: list[float]) -> type[Wire]:
    """Build a limiter connection that stalls the loop right after a request is out."""

    class StallAfterWrite(Wire):
        def write_command(self, transport: asyncio.Transport, packed: bytes) -> None:
            super().write_command(transport, packed)
            if stalls:
                _busy(stalls.pop())  # Redis answers while the loop is busy

    return StallAfterWrite


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_reply_that_came_in_while_the_loop_was_busy_is_used(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """The loop stalls past the deadline right after the pipeline is written."""

    async def main() -> None:
        stalls: list[float] = []
        limiter = Limiter.from_url(
            redis_server.url, wire_class=_stalling_after_write(stalls)
        )
        try:
            assert (await limiter.check("test:warm", [POLICY])).allowed
            for attempt in range(3):
                stalls.append(STALL)
                decision = await limiter.check(f"test:stalled-{attempt}", [POLICY])
                assert decision.allowed
                assert not stalls, "the stall happened"
            assert limiter.breaker.failures == 0
        finally:
            await limiter.aclose()

    _run(factory, main())


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_script_whose_reply_came_while_the_loop_was_busy_does_not_time_out(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """The wire's socket timeout counts Redis's time: a loop kept busy past it
    right after the write reads the reply instead of dropping the connection."""

    async def main() -> None:
        stalls: list[float] = []
        wire = _store_wire(redis_server, _stalling_after_write(stalls))
        try:
            assert await wire.call("PING") == b"PONG"
            for attempt in range(3):
                stalls.append(2 * STORE_TIMEOUT)
                word = f"late-{attempt}".encode()
                assert await wire.call("ECHO", word) == word
                assert not stalls, "the stall happened"
        finally:
            await wire.aclose()

    _run(factory, main())


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_command_sent_right_after_a_stall_keeps_the_connection(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """A loop busy past the socket timeout has not read the reply waiting in
    the socket: the next command (the limiter's flush writes at once) goes out
    on the same connection, and the earlier one gets its reply."""

    async def main() -> None:
        wire = _store_wire(redis_server, Wire)
        try:
            first = await wire.call("CLIENT", "ID")
            waiting = asyncio.ensure_future(wire.call("PING"))
            await asyncio.sleep(0)  # written
            _busy(2 * STORE_TIMEOUT)  # Redis answers while the loop is busy
            later = wire.send("CLIENT", "ID")
            assert later is not None, "the connection was given up"
            assert await waiting == b"PONG"
            assert await later == first
        finally:
            await wire.aclose()

    _run(factory, main())


def _stalling_wire_before_write(stalls: list[float]) -> type[Wire]:
    """Build a limiter connection that keeps the loop busy just before a write."""

    class StallBeforeWrite(Wire):
        def write_command(self, transport: asyncio.Transport, packed: bytes) -> None:
            if stalls:
                _busy(stalls.pop())  # the client's own work, before anything is out
            super().write_command(transport, packed)

    return StallBeforeWrite


def _stalling_before_write(stalls: list[float]) -> type[Connection]:
    """Build a service connection that keeps the loop busy just before a write."""

    class StallBeforeWrite(CancelSafeConnection):
        async def send_packed_command(
            self, command: bytes | str | Iterable[bytes], check_health: bool = True
        ) -> None:
            if stalls:
                _busy(stalls.pop())  # the client's own work, before anything is out
            await super().send_packed_command(command, check_health)

    return StallBeforeWrite


# Written just inside the budget; the proxy delays each reply by REPLY_DELAY.
BEFORE_WRITE = 0.95 * DECISION_BUDGET_SECONDS
REPLY_DELAY = 0.3 * DECISION_BUDGET_SECONDS


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_decision_written_late_counts_its_budget_from_the_write(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """95 ms of the client's own before the write, 30 ms of Redis's after: allowed.

    Counted from before the write, as it was, the budget ran out 5 ms after the
    write and every one of these decisions failed.
    """

    async def main() -> None:
        proxy = HangingProxy(redis_server.port)
        await proxy.start()
        stalls: list[float] = []
        limiter = Limiter.from_url(
            proxy.url, wire_class=_stalling_wire_before_write(stalls)
        )
        try:
            assert (await limiter.check("test:warm-write", [POLICY])).allowed
            proxy.delay = REPLY_DELAY  # connected, script loaded: one reply each
            for attempt in range(3):
                stalls.append(BEFORE_WRITE)
                decision = await limiter.check(f"test:late-write-{attempt}", [POLICY])
                assert decision.allowed
                assert not stalls, "the stall happened"
            assert limiter.breaker.failures == 0
        finally:
            await limiter.aclose()
            await proxy.stop()

    _run(factory, main())


async def test_within_counts_its_budget_from_the_write(
    redis_server: RedisServer,
) -> None:
    """The square's and the sessions' deadline: the same, through `within`."""
    proxy = HangingProxy(redis_server.port)
    await proxy.start()
    redis = connect(proxy.url, cluster=False, socket_timeout=1, connect_timeout=1)
    stalls: list[float] = []
    redis.connection_pool.connection_class = _stalling_before_write(stalls)
    try:
        await redis.ping()
        proxy.delay = REPLY_DELAY
        for _ in range(3):
            stalls.append(BEFORE_WRITE)
            assert await within(DECISION_BUDGET_SECONDS, redis.echo("x")) == b"x"
            assert not stalls, "the stall happened"
    finally:
        await redis.aclose()
        await proxy.stop()


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_decision_queued_behind_a_busy_loop_is_allowed(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """Time the loop spends elsewhere before the pipeline is sent is not Redis's."""

    async def main() -> None:
        limiter = Limiter.from_url(redis_server.url)
        loop = asyncio.get_running_loop()
        try:
            assert (await limiter.check("test:warm", [POLICY])).allowed
            for attempt in range(3):
                decision = asyncio.ensure_future(
                    limiter.check(f"test:queued-{attempt}", [POLICY])
                )
                await asyncio.sleep(0)  # the decision is queued for sending
                loop.call_soon(_busy, STALL)
                assert (await decision).allowed
            assert limiter.breaker.failures == 0
        finally:
            await limiter.aclose()

    _run(factory, main())


@pytest.mark.parametrize("factory", _loop_factories())
def test_within_uses_an_answer_that_came_in_while_the_loop_was_busy(
    factory: LoopFactory,
) -> None:
    """The square's and the refund's deadline read a waiting answer before failing."""

    async def main() -> None:
        ours, theirs = socket.socketpair()
        reader, writer = await asyncio.open_connection(sock=ours)
        try:
            answer = asyncio.ensure_future(within(0.05, reader.readexactly(2)))
            for _ in range(3):
                await asyncio.sleep(0)  # the read is waiting and the deadline armed
            theirs.sendall(b"ok")
            _busy(STALL)
            assert await answer == b"ok"
        finally:
            writer.close()
            theirs.close()

    _run(factory, main())


async def test_within_gives_up_on_a_silent_peer_without_cutting_the_read() -> None:
    """No answer: TimeoutError after the budget; the abandoned read is not cut."""
    ours, theirs = socket.socketpair()
    reader, writer = await asyncio.open_connection(sock=ours)
    read = asyncio.ensure_future(reader.readexactly(2))
    try:
        with collector_paused():
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await within(0.05, read)
            took = time.monotonic() - started
        assert 0.05 <= took < 0.05 + SETTLE_SECONDS + 0.1
        theirs.sendall(b"ok")
        assert await read == b"ok"
    finally:
        writer.close()
        theirs.close()


async def test_a_hung_redis_still_fails_the_decision_within_its_budget(
    redis_server: RedisServer,
) -> None:
    """A server that accepts and never answers costs one budget, not more."""
    proxy = HangingProxy(redis_server.port)
    proxy.hang = True
    await proxy.start()
    limiter = Limiter.from_url(proxy.url)
    try:
        for attempt in range(3):
            with collector_paused():
                started = time.monotonic()
                with pytest.raises(LimiterUnavailable):
                    await limiter.check(f"test:hung-{attempt}", [POLICY])
                took = time.monotonic() - started
            assert DECISION_BUDGET_SECONDS <= took < 1.5 * DECISION_BUDGET_SECONDS
        assert limiter.breaker.failures == 3
    finally:
        await limiter.aclose()
        await proxy.stop()


async def test_a_hung_redis_fails_even_while_the_loop_stays_busy(
    redis_server: RedisServer,
) -> None:
    """Late timers only postpone the verdict: after PATIENCE budgets it fails."""
    proxy = HangingProxy(redis_server.port)
    proxy.hang = True
    await proxy.start()
    limiter = Limiter.from_url(proxy.url)
    busy = True

    async def hog() -> None:
        while busy:
            _busy(0.03)  # every settle timer fires late: the loop looks stalled
            await asyncio.sleep(0)

    hogging = asyncio.ensure_future(hog())
    try:
        started = time.monotonic()
        with pytest.raises(LimiterUnavailable):
            await limiter.check("test:hung-busy", [POLICY])
        took = time.monotonic() - started
        assert took >= PATIENCE * DECISION_BUDGET_SECONDS
        assert took < 2 * PATIENCE * DECISION_BUDGET_SECONDS
    finally:
        busy = False
        await hogging
        await limiter.aclose()
        await proxy.stop()


# The service's own store timeouts, short so a stall outlasts them.
STORE_TIMEOUT = 0.1


def _store_wire(redis_server: RedisServer, kind: type[Wire]) -> Wire:
    """A store client's wire to the server, with its timeout and no retry."""
    options = {"port": redis_server.port, "socket_timeout": STORE_TIMEOUT}
    return kind({"host": "127.0.0.1", **options})


def _store(url: str) -> Redis:
    """A client as the service makes them, with short timeouts and no retry.

    The service retries once; a burst longer than two timeouts would time out both.
    """
    return connect(
        url,
        cluster=False,
        socket_timeout=STORE_TIMEOUT,
        connect_timeout=STORE_TIMEOUT,
        retries=0,
    )


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_store_reply_that_came_in_while_the_loop_was_busy_is_read(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """Redis answers during a stall longer than the socket timeout: no TimeoutError.

    Plain redis-py times out every one of these reads (its timer and the reply
    become ready together after the stall, and the timer runs first).
    """

    async def main() -> None:
        redis = _store(redis_server.url)
        loop = asyncio.get_running_loop()
        try:
            await redis.ping()
            for _ in range(3):
                # Redis answers after 50 ms, inside a stall from 20 ms to 320 ms.
                loop.call_later(0.02, _busy, 3 * STORE_TIMEOUT)
                assert await redis.blpop(["test:nothing"], timeout=0.05) is None
        finally:
            await redis.aclose()

    _run(factory, main())


@pytest.mark.parametrize("factory", _loop_factories())
def test_a_store_connection_opened_while_the_loop_was_busy_is_used(
    redis_server: RedisServer, factory: LoopFactory
) -> None:
    """A connect that completes during a stall is used (plain redis-py times it out)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for _ in range(3):
            redis = _store(redis_server.url)
            try:
                loop.call_soon(_busy, 3 * STORE_TIMEOUT)  # the connect is under way
                assert await redis.ping()
            finally:
                await redis.aclose()

    _run(factory, main())


async def test_a_hung_store_still_times_out_after_its_socket_timeout(
    redis_server: RedisServer,
) -> None:
    """A server that accepts and never answers: redis-py's TimeoutError, in time."""
    proxy = HangingProxy(redis_server.port)
    proxy.hang = True
    await proxy.start()
    redis = _store(proxy.url)
    try:
        with collector_paused():
            started = time.monotonic()
            with pytest.raises(RedisTimeout):
                await redis.ping()
            took = time.monotonic() - started
        assert STORE_TIMEOUT <= took < STORE_TIMEOUT + SETTLE_SECONDS + 0.1
    finally:
        await redis.aclose()
        await proxy.stop()


async def test_patiently_times_out_in_a_task_cleaning_up_after_a_cancel() -> None:
    """Work done while handling a cancel gets its TimeoutError; the cancel goes on."""
    timed_out = False

    async def clean_up() -> None:
        nonlocal timed_out
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            try:
                with patiently(0.05):
                    await asyncio.sleep(10)  # a peer that never answers
            except TimeoutError:
                timed_out = True
            raise

    cleaning = asyncio.ensure_future(clean_up())
    await asyncio.sleep(0.01)
    cleaning.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cleaning
    assert timed_out


async def test_patiently_keeps_an_outer_cancel_a_cancel() -> None:
    """A cancel from outside passes through as CancelledError, not TimeoutError."""

    async def wait() -> None:
        with patiently(10.0):
            await asyncio.sleep(10)

    waiting = asyncio.ensure_future(wait())
    await asyncio.sleep(0.01)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_sign_in_on_a_cpu_bound_event_loop_never_answers_503(
    client: Client,
    mail_server: MailCatcher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Another coroutine's CPU work delays sign-in; a healthy Redis never refuses it."""
    # A running service has its connections open before such work comes along.
    warm = await client.post("/api/auth/code", json={"email": _address()})
    assert warm.status == 200
    busy = True

    async def hog() -> None:
        while busy:  # each slice outlasts a decision's budget; a few turns between
            _busy(STALL)
            for _ in range(10):
                await asyncio.sleep(0)

    valid = [_address()]
    invalid = ["user@[127.0.0.1]", "not-an-address", "a@b"]
    statuses = []
    hogging = asyncio.ensure_future(hog())
    try:
        with caplog.at_level(logging.WARNING):
            for email in invalid + valid:
                response = await client.post("/api/auth/code", json={"email": email})
                statuses.append(response.status)
    finally:
        busy = False
        await hogging
    assert statuses == [400] * len(invalid) + [200] * len(valid)
    assert "limiter unavailable" not in caplog.text
    sent = {message["To"] for message in mail_server.messages}
    assert set(valid) <= sent
