"""The workbench's resources for the life of an app process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from ..keys import CLOCK, CONTENT, REDIS, SETTINGS
from ..metrics import METRICS
from .events import EventHub
from .keys import EVENTS, MEDIA, ROUTING
from .media.chosen import opened_media_store
from .upstreams.registry import Routing, Upstreams

# `make run` runs one worker inside the dev process.
EMBEDDED_WORKER: Final = web.AppKey("embedded_worker", bool)


async def studio_ctx(app: web.Application) -> AsyncIterator[None]:
    """Open the media store, the routing and the event hub; close them at exit."""
    settings = app[SETTINGS].workbench
    app[MEDIA] = await opened_media_store(settings)
    app[ROUTING] = Routing(settings)
    hub = app[EVENTS] = EventHub(app[REDIS])
    yield
    await hub.aclose()


async def end_event_streams(app: web.Application) -> None:
    """End every open event stream, so shutdown does not wait on them."""
    await app[EVENTS].aclose()


async def embedded_worker_ctx(app: web.Application) -> AsyncIterator[None]:
    """Run one worker in this process (make run); stop it with the app."""
    if not app.get(EMBEDDED_WORKER, False):
        yield
        return
    from .worker import Worker  # here: `serve` never loads the media encoders

    upstreams = Upstreams(app[SETTINGS].workbench)
    worker = Worker(
        redis=app[REDIS],
        content=app[CONTENT],
        settings=app[SETTINGS].workbench,
        media=app[MEDIA],
        upstream_for=upstreams,
        metrics=app[METRICS],
        wait_replicas=app[SETTINGS].redis_wait_replicas,
        clock=app[CLOCK],
        base_url=app[SETTINGS].base_url,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop), name="embedded-worker")
    yield
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await upstreams.aclose()
