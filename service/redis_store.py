"""Own the application's Redis client for the life of the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from redis.asyncio import Redis

from .keys import REDIS, SETTINGS


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the client lazily (no connection at start-up) and close it at exit."""
    client = Redis.from_url(
        app[SETTINGS].redis_url,
        socket_connect_timeout=1.0,
        socket_timeout=2.0,
        health_check_interval=30,
    )
    app[REDIS] = client
    yield
    await client.aclose()
