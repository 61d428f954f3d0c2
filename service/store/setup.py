"""Own the application's Redis client for the life of the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from ..keys import REDIS, SETTINGS
from .connect import connect, warm


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the client, reach Redis once if it is there, and close it at exit.

    Timeouts are short and there is one immediate retry: a request that needs a
    dead Redis fails in about a second at worst, as 503 UNAVAILABLE. A Redis
    that is down at start-up does not stop the public pages from serving.
    """
    settings = app[SETTINGS]
    client = connect(
        settings.redis_url,
        cluster=settings.redis_cluster,
        connect_timeout=0.5,
        socket_timeout=1.0,
        health_check_interval=30,
    )
    app[REDIS] = client
    await warm(client)
    yield
    await client.aclose()


def setup(app: web.Application) -> None:
    """Open the client first, so every concern's stores can be built on it."""
    app.cleanup_ctx.append(redis_ctx)
