"""Own the application's Redis client for the life of the app."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from ..auth.accounts import AccountStore
from ..auth.codes import CodeStore
from ..auth.devices import DeviceStore
from ..auth.identity import Keyring
from ..auth.sessions import SessionStore
from ..keys import (
    ACCOUNTS,
    CODES,
    DEVICES,
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
from ..limits.limiter import GCRA_SCRIPT, REFUND_SCRIPT, Limiter
from ..square.feed import SquareStore
from ..studio.generations import GenerationStore
from ..studio.ledger import Ledger
from ..studio.queue import JobQueue
from ..studio.works import WorkStore
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
    app[CODES] = CodeStore(client, settings.secret_key)
    app[DEVICES] = DeviceStore(client)
    ledger = Ledger(
        client,
        trial_credits=settings.trial_credits,
        expire_months=settings.workbench.expire_months,
        wait_replicas=settings.redis_wait_replicas,
    )
    app[LEDGER] = ledger
    keyring = Keyring(settings.secret_key, settings.secret_key_previous)
    app[ACCOUNTS] = AccountStore(client, ledger, keyring)
    app[GENERATIONS] = GenerationStore(client, settings.redis_wait_replicas)
    app[JOBS] = JobQueue(client)
    app[SESSIONS] = SessionStore(client)
    square = app[SQUARE] = SquareStore(client, settings.workbench.square_read_budget)
    app[WORKS] = WorkStore(client, square)
    await warm(client)
    yield
    await client.aclose()


async def limiter_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the limiter its own pool: no retries, its own deadlines per decision."""
    settings = app[SETTINGS]
    limiter = Limiter.from_url(settings.redis_url, cluster=settings.redis_cluster)
    app[LIMITER] = limiter
    await warm(limiter.redis, (GCRA_SCRIPT, REFUND_SCRIPT))
    yield
    await limiter.aclose()
