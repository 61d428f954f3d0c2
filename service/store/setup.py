"""Own the application's Redis client for the life of the app."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from ..keys import REDIS, SETTINGS
from .connect import STORE_ERRORS, connect, warm

_LOGGER: Final = logging.getLogger(__name__)


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
    try:
        await client.aclose()
    except STORE_ERRORS as err:  # e.g. a thousand connections slow to close at once
        _LOGGER.warning("Redis connections not all closed in time at exit: %s", err)


def setup(app: web.Application) -> None:
    """Open the client first, so every concern's stores can be built on it."""
    app.cleanup_ctx.append(redis_ctx)
