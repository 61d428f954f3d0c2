"""The workbench: its stores, media, upstreams, events, worker and /api routes."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from ..api.boundary import API
from ..keys import REDIS, SETTINGS
from ..limits.setup import report_limits
from ..metrics import QUEUE_DEPTH
from ..square.feed import SQUARE
from .collections import setup_collection_routes
from .context import embedded_worker_ctx, end_event_streams, studio_ctx
from .daily import setup_daily_routes
from .endpoints import ACCOUNT_LIMITED, setup_studio_routes
from .generations import GenerationStore
from .keys import EVENT_VIEWS, GENERATIONS, JOBS, LEDGER, POSITIONS, WORKS
from .ledger import Ledger
from .library import LIBRARY_LIMITED, setup_library_routes
from .media.serving import setup_media_routes
from .positions import Positions
from .presets import setup_preset_routes
from .queue import JobQueue
from .requeue import setup_requeue_routes
from .works import WorkStore


async def stores_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the ledger, the generations, the queue and the works on the app's Redis."""
    settings, client = app[SETTINGS], app[REDIS]
    app[LEDGER] = Ledger(
        client,
        trial_credits=settings.trial_credits,
        expire_months=settings.workbench.expire_months,
        wait_replicas=settings.redis_wait_replicas,
    )
    app[GENERATIONS] = GenerationStore(client, settings.redis_wait_replicas)
    jobs = app[JOBS] = JobQueue(client)
    app[QUEUE_DEPTH] = jobs.depth
    app[WORKS] = WorkStore(client, app[SQUARE])
    app[POSITIONS] = Positions(client)
    yield


def setup(app: web.Application) -> None:
    """Register the workbench's routes, its media and its resources, in order."""
    # Concerns above the studio add how their events show (payments: "order").
    app[EVENT_VIEWS] = {}
    setup_studio_routes(app[API])
    setup_library_routes(app[API])
    setup_preset_routes(app[API])
    setup_collection_routes(app, app[API])
    setup_daily_routes(app, app[API])
    setup_requeue_routes(app[API])
    report_limits(app, ACCOUNT_LIMITED | LIBRARY_LIMITED)
    setup_media_routes(app)
    app.cleanup_ctx.extend([stores_ctx, studio_ctx, embedded_worker_ctx])
    app.on_shutdown.append(end_event_streams)
