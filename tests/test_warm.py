"""A process reaches Redis and loads its scripts before its first request."""

from __future__ import annotations

import hashlib
import time

from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.limits.limiter import GCRA_BATCH_SCRIPT, REFUND_SCRIPT
from service.store.connect import WARM_SECONDS

from .conftest import SettingsFactory
from .ports import free_port


def _sha(script: str) -> str:
    return hashlib.sha1(script.encode()).hexdigest()


async def test_a_started_app_has_loaded_the_limiter_scripts_before_any_request(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """The first sign-in's decision pays no NOSCRIPT round trip in its 100 ms."""
    await redis.script_flush()
    await aiohttp_client(create_app(make_settings()))
    loaded = await redis.script_exists(_sha(GCRA_BATCH_SCRIPT), _sha(REFUND_SCRIPT))
    assert loaded == [True, True]


async def test_an_app_starts_and_serves_its_pages_with_redis_down(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory
) -> None:
    """Nothing listens at the Redis address: start-up goes on, pages answer."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    started = time.monotonic()
    client = await aiohttp_client(create_app(make_settings(STUDIO_REDIS_URL=url)))
    assert time.monotonic() - started < 2 * WARM_SECONDS
    assert (await client.get("/healthz")).status == 200
    assert (await client.get("/en")).status == 200
