"""Own the application's Redis client for the life of the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from ..auth.accounts import AccountStore
from ..auth.codes import CodeStore
from ..auth.sessions import SessionStore
from ..keys import (
    ACCOUNTS,
    CODES,
    GENERATIONS,
    JOBS,
    LEDGER,
    LIMITER,
    REDIS,
    SESSIONS,
    SETTINGS,
    SQUARE,
    WORKS,
)
from ..limits.limiter import Limiter
from ..square.feed import SquareStore
from ..studio.generations import GenerationStore
from ..studio.ledger import Ledger
from ..studio.queue import JobQueue
from ..studio.works import WorkStore


async def redis_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the client lazily (no connection at start-up) and close it at exit.

    Timeouts are short and there is one immediate retry: a request that needs a
    dead Redis fails in about a second at worst, as 503 UNAVAILABLE.
    """
    settings = app[SETTINGS]
    client = Redis.from_url(
        settings.redis_url,
        socket_connect_timeout=0.5,
        socket_timeout=1.0,
        retry=Retry(NoBackoff(), 1),
        health_check_interval=30,
    )
    app[REDIS] = client
    app[CODES] = CodeStore(client, settings.secret_key)
    ledger = Ledger(
        client,
        trial_credits=settings.trial_credits,
        expire_months=settings.workbench.expire_months,
    )
    app[LEDGER] = ledger
    app[ACCOUNTS] = AccountStore(client, ledger)
    app[GENERATIONS] = GenerationStore(client)
    app[JOBS] = JobQueue(client)
    app[SESSIONS] = SessionStore(client)
    square = app[SQUARE] = SquareStore(client)
    app[WORKS] = WorkStore(client, square)
    yield
    await client.aclose()


async def limiter_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the limiter its own pool: no retries, its own deadlines per decision."""
    limiter = Limiter.from_url(app[SETTINGS].redis_url)
    app[LIMITER] = limiter
    yield
    await limiter.aclose()
