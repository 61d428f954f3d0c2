"""Redis stopped or hung: the square fails open, sign-in fails closed, both in time."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator

import pytest
from pytest_aiohttp import AiohttpClient

from service.app import create_app
from service.limits.keys import LIMITER
from service.square.feed import SQUARE
from service.store.embedded import MailCatcher, RedisServer

from .chaos import HangingProxy
from .conftest import Client, SettingsFactory, collector_paused
from .ports import free_port
from .test_square import sample_work
from .workbench import sign_in

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = pytest.mark.timing

BUDGET = 0.15


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(port=free_port()) as server:
        yield server


@pytest.fixture
async def proxy(own_redis: RedisServer) -> AsyncIterator[HangingProxy]:
    chaos = HangingProxy(own_redis.port)
    await chaos.start()
    yield chaos
    await chaos.stop()


async def _app(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, url: str
) -> Client:
    client = await aiohttp_client(create_app(make_settings(STUDIO_REDIS_URL=url)))
    await client.app[SQUARE].publish(sample_work(1), owner="someone")
    # A visitor has looked at the square once: its first page is in memory.
    assert (await client.get("/api/square")).status == 200
    return client


async def _timed(
    client: Client, method: str, path: str, **kwargs: object
) -> tuple[int, float]:
    started = time.monotonic()
    response = await client.request(method, path, **kwargs)  # type: ignore[arg-type]
    await response.read()
    return response.status, time.monotonic() - started


async def _assert_degraded(client: Client) -> None:
    # The bound is about waiting on Redis, not about this test process's heap: a
    # full collection over everything earlier tests left behind must not land in
    # a timed request (production freezes its start-up objects instead).
    with collector_paused():
        await _time_degraded(client)


async def _time_degraded(client: Client) -> None:
    timings: list[tuple[str, int, float]] = []
    for _ in range(8):  # before and after the breaker opens
        status, took = await _timed(client, "GET", "/api/square")
        timings.append(("square", status, took))
        status, took = await _timed(
            client, "POST", "/api/auth/code", json={"email": "down@example.com"}
        )
        timings.append(("code", status, took))
        status, took = await _timed(client, "GET", "/healthz")
        timings.append(("healthz", status, took))
    expected = {"square": 200, "code": 503, "healthz": 200}
    assert all(status == expected[name] for name, status, _ in timings), timings
    slow = [entry for entry in timings if entry[2] >= BUDGET]
    assert not slow, slow


async def test_a_stopped_redis_keeps_the_square_open_and_sign_in_closed(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    own_redis: RedisServer,
) -> None:
    """Connection refused: 200 from memory and a local bucket; 503 for sign-in."""
    client = await _app(aiohttp_client, make_settings, own_redis.url)
    own_redis.stop()
    await _assert_degraded(client)
    denied = await client.post("/api/auth/code", json={"email": "down@example.com"})
    assert await denied.json() == {"error": "UNAVAILABLE"}
    assert int(denied.headers["Retry-After"]) > 0
    own_redis.start()
    await _assert_recovers(client)


async def test_a_hung_redis_keeps_the_square_open_and_sign_in_closed(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, proxy: HangingProxy
) -> None:
    """A server that accepts and never answers costs at most one budget."""
    client = await _app(aiohttp_client, make_settings, proxy.url)
    proxy.hang = True
    await _assert_degraded(client)
    proxy.hang = False
    await _assert_recovers(client)


async def _assert_recovers(client: Client) -> None:
    """Without a restart, sign-in works again once the breaker's trial succeeds."""
    breaker = client.app[LIMITER].breaker
    assert breaker.opened_at is not None
    breaker.opened_at -= breaker.cooldown  # what waiting out the cooldown would do
    response = await client.post("/api/auth/code", json={"email": "back@example.com"})
    assert response.status == 200
    assert breaker.opened_at is None


async def test_a_hung_redis_answers_a_session_route_503_within_its_budget(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    proxy: HangingProxy,
) -> None:
    """/api/me with Redis silent: 503 in about a quarter second, not 3 s."""
    client = await aiohttp_client(create_app(make_settings(STUDIO_REDIS_URL=proxy.url)))
    await sign_in(client, mail_server)
    proxy.hang = True
    with collector_paused():  # the bound is about Redis, not the collector
        status, took = await _timed(client, "GET", "/api/me")
    assert status == 503
    assert took < 0.6, took


async def test_a_slow_redis_still_serves_a_process_first_square_page(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, proxy: HangingProxy
) -> None:
    """With nothing in memory to fall back on, a late answer beats a 503."""
    client = await aiohttp_client(create_app(make_settings(STUDIO_REDIS_URL=proxy.url)))
    work = await client.app[SQUARE].publish(sample_work(1), owner="someone")
    proxy.delay = 0.15  # each reply later than the warm read budget of 0.1 s
    response = await client.get("/api/square")
    assert response.status == 200
    assert [item["id"] for item in (await response.json())["items"]] == [work.id]


async def test_a_hung_redis_answers_a_cold_square_page_503_within_a_second(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, proxy: HangingProxy
) -> None:
    """The longer budget of a first read still ends: 503, never a hang."""
    client = await aiohttp_client(create_app(make_settings(STUDIO_REDIS_URL=proxy.url)))
    await client.app[SQUARE].publish(sample_work(1), owner="someone")
    proxy.hang = True
    with collector_paused():
        status, took = await _timed(client, "GET", "/api/square")
    assert status == 503
    assert took < 1.6, took
