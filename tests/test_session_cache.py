"""Each process keeps sessions it read for seconds, forgetting ended ones at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.auth.sessions import COOKIE, SESSIONS
from service.store.embedded import MailCatcher, RedisServer

from .conftest import Client, SettingsFactory, listening
from .ports import free_port
from .workbench import sign_in, studio_command


async def _session_reads_during(
    redis: Redis, requests: Callable[[], Awaitable[None]]
) -> int:
    """Count the commands naming a session key while `requests` run (MONITOR)."""
    seen = 0
    async with redis.monitor() as monitor:
        await redis.ping()  # the monitor is live once it sees this
        while "PING" not in (await monitor.next_command())["command"]:
            pass
        await requests()
        await redis.echo("done")
        while "ECHO" not in (command := (await monitor.next_command())["command"]):
            seen += "studio:session:" in command
    return seen


def _cookie(client: Client) -> dict[str, str]:
    jar = client.session.cookie_jar.filter_cookies(client.make_url("/api/me"))
    return {"Cookie": f"{COOKIE}={jar[COOKIE].value}"}


async def _status_soon(client: Client, headers: dict[str, str], want: int) -> int:
    """Ask /api/me until it answers `want`, for at most half a second."""
    status = 0
    for _ in range(50):
        status = (await client.get("/api/me", headers=headers)).status
        if status == want:
            break
        await asyncio.sleep(0.01)
    return status


async def test_a_session_read_again_within_seconds_costs_no_redis_round_trip(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """Ten requests of one person read the session from Redis once."""
    await listening(client)
    await sign_in(client, mail_server)

    async def ten() -> None:
        for _ in range(10):
            assert (await client.get("/api/me")).status == 200

    assert await _session_reads_during(redis, ten) == 1


async def test_a_logout_on_one_process_ends_the_session_on_every_other_at_once(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
) -> None:
    """The other process had the session in memory; the published end drops it."""
    first = await aiohttp_client(create_app(make_settings()))
    second = await aiohttp_client(create_app(make_settings()))
    await listening(first)
    await listening(second)
    await sign_in(first, mail_server)
    cookie = _cookie(first)
    assert (await second.get("/api/me", headers=cookie)).status == 200
    assert (await first.post("/api/auth/logout")).status == 204
    assert await _status_soon(second, cookie, 401) == 401


async def test_a_shell_revoke_ends_sessions_cached_by_a_running_app(
    client: Client,
    mail_server: MailCatcher,
    redis_server: RedisServer,
    make_settings: SettingsFactory,
) -> None:
    """`studio sessions revoke` runs in another process and still reaches the cache."""
    await listening(client)
    email = "revoked-cache@example.com"
    await sign_in(client, mail_server, email)
    assert (await client.get("/api/me")).status == 200
    settings = make_settings()
    environ = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": settings.secret_key,
    }
    done = await studio_command("sessions", "revoke", email, environ=environ)
    assert done.returncode == 0, done.stderr
    assert await _status_soon(client, {}, 401) == 401


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(port=free_port()) as server:
        yield server


async def test_a_lost_subscription_empties_the_cache_and_stops_using_it(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    own_redis: RedisServer,
) -> None:
    """Ends may go unheard while Redis is away, so nothing cached is trusted."""
    client = await aiohttp_client(
        create_app(make_settings(STUDIO_REDIS_URL=own_redis.url))
    )
    cache = client.app[SESSIONS].cache
    await listening(client)
    await sign_in(client, mail_server)
    assert (await client.get("/api/me")).status == 200
    own_redis.stop()
    for _ in range(300):
        if not cache.listening:
            break
        await asyncio.sleep(0.01)
    assert not cache.listening
    assert (await client.get("/api/me")).status == 503
