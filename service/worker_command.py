"""The `worker` command: generation jobs, reconciling, exports and purges.

Its own module, imported only when the command runs, so that `serve` never
loads what only workers use (media encoders, vendor SDKs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Final

from redis.asyncio import Redis

from .account.deletion import DeletionStore
from .account.exports import ExportJobs
from .account.purger import Purger
from .content import Content, content_for
from .labels.notices import notices, require_signing_key
from .metrics import metrics_for, serve_metrics
from .payments.context import opened as payments_opened
from .payments.reconciler import Reconciler
from .settings import Settings, SettingsError, refuse_fake_payments
from .store.connect import connect
from .studio.media.chosen import opened_media_store
from .studio.upstreams.registry import Upstreams
from .studio.worker import Worker

_LOGGER: Final = logging.getLogger("service")


def worker_redis(url: str, *, cluster: bool) -> Redis:
    """Connect as a worker does: patient reads (a job's settlement can wait out a
    failover), three retries."""
    return connect(
        url, cluster=cluster, connect_timeout=1.0, socket_timeout=5.0, retries=3
    )


async def _work(settings: Settings, content: Content) -> None:
    media = await opened_media_store(settings.workbench)  # first: it may refuse
    redis = worker_redis(settings.redis_url, cluster=settings.redis_cluster)
    upstreams = Upstreams(settings.workbench)
    workbench = settings.workbench
    worker = Worker(
        redis=redis,
        content=content,
        settings=workbench,
        media=media,
        upstream_for=upstreams,
        metrics=metrics_for(settings),
        wait_replicas=settings.redis_wait_replicas,
        base_url=settings.base_url,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    _LOGGER.info(
        "worker %s: %d jobs at once", worker.consumer, workbench.worker_concurrency
    )
    try:
        async with contextlib.AsyncExitStack() as exposed:
            if settings.metrics_port:
                await exposed.enter_async_context(
                    contextlib.asynccontextmanager(serve_metrics)(
                        worker.metrics, settings.metrics_host, settings.metrics_port
                    )
                )
            # Every worker also follows orders whose payment notice never came.
            providers, orders, _ = await exposed.enter_async_context(
                payments_opened(settings, redis)
            )
            reconciler = Reconciler(
                orders,
                providers,
                every=settings.payments.reconcile_seconds,
                after=settings.payments.reconcile_after,
            )
            reconciling = asyncio.create_task(reconciler.run(stop), name="reconciler")
            # ... and builds the exports people ask for ("export my data").
            exports = ExportJobs(
                redis,
                media,
                lease_seconds=workbench.visibility_timeout,
                privacy_url=f"{settings.base_url}/privacy",
            )
            exporting = asyncio.create_task(exports.run(stop), name="exports")
            # ... and purges the accounts whose grace period is over.
            purger = Purger(
                DeletionStore.build(redis, settings, media),
                every=settings.account.purge_seconds,
            )
            purging = asyncio.create_task(purger.run(stop), name="purger")
            try:
                await worker.run(stop)
            finally:
                stop.set()
                await reconciling
                await exporting
                await purging
    finally:
        await upstreams.aclose()
        await redis.aclose()
        _LOGGER.info("worker %s stopped", worker.consumer)


def work(settings: Settings, loop: asyncio.AbstractEventLoop) -> None:
    """Run a worker process on `loop`: jobs until SIGTERM, then hand back."""
    if not settings.redis_url:
        raise SettingsError("STUDIO_REDIS_URL: required by worker")
    refuse_fake_payments(settings)
    content = content_for(settings)
    if settings.workbench.demo_upstream:
        _LOGGER.warning("STUDIO_DEMO_UPSTREAM is on: every model runs on the demo")
    require_signing_key(settings.workbench.labels)
    for notice in notices(settings.workbench.labels):
        _LOGGER.warning("%s", notice)
    try:
        loop.run_until_complete(_work(settings, content))
    finally:
        loop.close()
