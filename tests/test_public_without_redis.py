"""The public surface never touches Redis: it answers the same with Redis gone."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from pytest_aiohttp import AiohttpClient
from redis import Redis

from service.app import create_app
from service.store.embedded import RedisServer
from service.web.routes import PUBLIC_ROUTES

from .conftest import Client, SettingsFactory, listening
from .ports import free_port

Snapshot = dict[tuple[str, str], tuple[int, str, str, bytes]]


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    """A server this test may stop."""
    with RedisServer(port=free_port()) as server:
        yield server


async def _snapshot(client: Client) -> Snapshot:
    answers: Snapshot = {}
    for route in PUBLIC_ROUTES:
        for accept in ("*/*", "text/markdown"):
            response = await client.get(route.path, headers={"Accept": accept})
            answers[route.path, accept] = (
                response.status,
                response.headers["Content-Type"],
                response.headers.get("ETag", ""),
                await response.read(),
            )
    return answers


def _commands(probe: Redis) -> int:
    return int(probe.info("stats")["total_commands_processed"])


async def test_every_public_endpoint_answers_unchanged_with_redis_stopped(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    own_redis: RedisServer,
) -> None:
    """Snapshot all thirteen endpoints, stop Redis, and get the same answers."""
    client = await aiohttp_client(
        create_app(make_settings(STUDIO_REDIS_URL=own_redis.url))
    )
    await listening(client)  # the session-end listener's own start-up is done
    with Redis.from_url(own_redis.url) as probe:
        idle = -_commands(probe) + _commands(probe)
        start = _commands(probe)
        before = await _snapshot(client)
        # Only the probe's own INFO reached the server while the surface was read.
        assert _commands(probe) - start == idle
    own_redis.stop()
    after = await _snapshot(client)
    assert after == before
    assert all(status == 200 for status, *_ in after.values())
