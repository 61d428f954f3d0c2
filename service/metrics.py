"""Prometheus metrics on a listener of their own, never on the public port.

With no listener (metrics.port = 0, the default) nothing could read a count,
so nothing is counted: the counters are inert and prometheus_client is never
imported (0.8 MB of every process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Protocol

from aiohttp import web
from aiohttp.typedefs import Handler

from .api.boundary import API, ApiBoundary, route_name
from .keys import SETTINGS
from .settings import Settings

_LOGGER: Final = logging.getLogger(__name__)
QUEUE_DEPTH_SECONDS: Final = 5.0
_OUTCOMES: Final = ("allowed", "denied", "fallback")


class Counted(Protocol):
    """One series of a counter."""

    def inc(self, amount: float = 1) -> None: ...


class Counters(Protocol):
    """A counter: a series per combination of its labels."""

    def labels(self, *values: str) -> Counted: ...


class Observed(Protocol):
    """One series of a histogram."""

    def observe(self, amount: float) -> None: ...


class Histograms(Protocol):
    """A histogram: a series per combination of its labels."""

    def labels(self, *values: str) -> Observed: ...


class Level(Protocol):
    """A gauge without labels."""

    def set(self, value: float) -> None: ...


class _Inert:
    """Every kind of series at once, counting nothing: metrics are off."""

    def labels(self, *values: str) -> _Inert:
        return self

    def inc(self, amount: float = 1) -> None:
        pass

    def observe(self, amount: float) -> None:
        pass

    def set(self, value: float) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Metrics:
    """The service's counters, counting (Prometheus) or inert."""

    requests: Counters
    decisions: Mapping[str, Counted]  # the limiter's three, looked up once
    queue_depth: Level
    job_seconds: Histograms
    upstream_errors: Counters
    credits: Counters
    notices: Counters
    counting: bool
    exposition: Callable[[], bytes]  # the Prometheus text format
    exposition_type: str  # its Content-Type

    @classmethod
    def inert(cls) -> Metrics:
        """Counters that count nothing, for a process with no listener."""
        nothing = _Inert()
        return cls(
            requests=nothing,
            decisions=dict.fromkeys(_OUTCOMES, nothing),
            queue_depth=nothing,
            job_seconds=nothing,
            upstream_errors=nothing,
            credits=nothing,
            notices=nothing,
            counting=False,
            exposition=lambda: b"",
            exposition_type="text/plain; charset=utf-8",
        )

    @classmethod
    def prometheus(cls) -> Metrics:
        """Counters in a Prometheus registry of their own (no process-global state)."""
        from prometheus_client import (  # here: only a process with a listener
            CONTENT_TYPE_LATEST,
            CollectorRegistry,
            Counter,
            Gauge,
            Histogram,
            generate_latest,
        )

        registry = CollectorRegistry()
        limiter = Counter(
            "studio_limiter_decisions",
            "Rate-limit decisions: allowed, denied, or fallback (Redis unavailable)",
            ["outcome"],
            registry=registry,
        )
        return cls(
            requests=Counter(
                "studio_http_requests",
                "HTTP requests answered, by route name and status",
                ["route", "status"],
                registry=registry,
            ),
            decisions={outcome: limiter.labels(outcome) for outcome in _OUTCOMES},
            queue_depth=Gauge(
                "studio_queue_depth",
                "Generation jobs queued or running",
                registry=registry,
            ),
            job_seconds=Histogram(
                "studio_job_seconds",
                "Time a worker spent on a job, by model and outcome",
                ["model", "outcome"],
                buckets=(0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200),
                registry=registry,
            ),
            upstream_errors=Counter(
                "studio_upstream_errors",
                "Upstream failures, by public error code and whether they were retried",
                ["code", "transient"],
                registry=registry,
            ),
            credits=Counter(
                "studio_credits",
                "Credits debited at submit and refunded on failure or cancel",
                ["movement"],
                registry=registry,
            ),
            notices=Counter(
                "studio_payment_notices",
                "Payment notices from the providers by outcome, and orders a provider"
                " could not create (outcome create_failed)",
                ["provider", "outcome"],
                registry=registry,
            ),
            counting=True,
            exposition=lambda: generate_latest(registry),
            exposition_type=CONTENT_TYPE_LATEST,
        )


def metrics_for(settings: Settings) -> Metrics:
    """Count when a listener will expose the counts (metrics.port), else not."""
    return Metrics.prometheus() if settings.metrics_port else Metrics.inert()


METRICS: Final = web.AppKey("metrics", Metrics)
# How many jobs wait in the queue, asked every few seconds (the studio sets it).
QUEUE_DEPTH: Final = web.AppKey[Callable[[], Awaitable[int]]]("queue_depth")


async def serve_metrics(metrics: Metrics, host: str, port: int) -> AsyncIterator[None]:
    """Listen on host:port for /metrics while the caller's work runs."""

    async def scrape(request: web.Request) -> web.Response:
        return web.Response(
            body=metrics.exposition(),
            headers={
                "Content-Type": metrics.exposition_type,
                "Cache-Control": "no-store",
            },
        )

    app = web.Application()
    app.router.add_get("/metrics", scrape)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    _LOGGER.info("metrics on http://%s:%d/metrics", host, port)
    try:
        yield
    finally:
        await runner.cleanup()


def setup_request_metrics(api: ApiBoundary, metrics: Metrics) -> None:
    """Count every /api answer by route and status (the outermost layer)."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        name = route_name(route) or "unnamed"
        counters: dict[int, Any] = {}  # a route's series by status, looked up once

        async def counted(request: web.Request) -> web.StreamResponse:
            """Count the answer, whatever it is."""
            response = await handler(request)
            status = response.status
            if (counter := counters.get(status)) is None:
                counter = counters[status] = metrics.requests.labels(name, str(status))
            counter.inc()
            return response

        return counted

    api.add_layer(layer)


async def metrics_ctx(app: web.Application) -> AsyncIterator[None]:
    """Expose /metrics on STUDIO_METRICS_PORT and keep the queue depth current."""
    settings = app[SETTINGS]
    if not settings.metrics_port:
        yield
        return
    metrics = app[METRICS]
    depth = asyncio.create_task(track_queue_depth(metrics, app[QUEUE_DEPTH]))
    async with contextlib.asynccontextmanager(serve_metrics)(
        metrics, settings.metrics_host, settings.metrics_port
    ):
        yield
    depth.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await depth


async def track_queue_depth(metrics: Metrics, read: object) -> None:
    """Refresh the queue depth gauge every few seconds (cancelled at exit)."""
    assert callable(read)
    while True:
        with contextlib.suppress(Exception):
            metrics.queue_depth.set(await read())
        await asyncio.sleep(QUEUE_DEPTH_SECONDS)


def setup(app: web.Application) -> None:
    """Count every /api answer; serve /metrics and the queue depth if asked to.

    Set up after the studio: the queue depth it watches is the studio's.
    """
    metrics = app[METRICS] = metrics_for(app[SETTINGS])
    with app[API].placed("metrics"):
        if metrics.counting:
            setup_request_metrics(app[API], metrics)
    app.cleanup_ctx.append(metrics_ctx)
