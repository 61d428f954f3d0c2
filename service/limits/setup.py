"""Rate limits: the limiter's client, its three /api layers, and which routes it guards.

Each concern names the routes it limits (`limit_routes`) and those whose
per-account limits its handlers charge (`report_limits`); the layers read
both when the boundary is installed, after every concern is set up.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Set
from typing import Final

from aiohttp import web

from ..api.boundary import API
from ..keys import SETTINGS
from ..store.connect import warm
from ..web.keys import SECURITY
from .http import (
    RouteLimit,
    setup_rate_headers,
    setup_ratelimit,
    setup_remembered_denials,
)
from .keys import LIMITER
from .limiter import GCRA_BATCH_SCRIPT, REFUND_SCRIPT, Limiter

# The per-client policies of each limited route, by route name.
ROUTE_LIMITS: Final = web.AppKey("route_limits", dict[str, RouteLimit])
# Every route whose answers carry RateLimit headers, limited here or in its handler.
REPORTED: Final = web.AppKey("reported", set[str])


async def limiter_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the limiter its own pool: no retries, its own deadlines per decision."""
    settings = app[SETTINGS]
    limiter = Limiter.from_url(settings.redis_url, cluster=settings.redis_cluster)
    app[LIMITER] = limiter
    await warm(limiter.redis, (GCRA_BATCH_SCRIPT, REFUND_SCRIPT))
    yield
    await limiter.aclose()


def limit_routes(app: web.Application, routes: Mapping[str, RouteLimit]) -> None:
    """Charge these routes' per-client buckets at the boundary, and report them."""
    app[ROUTE_LIMITS].update(routes)
    app[REPORTED].update(routes)


def report_limits(app: web.Application, names: Set[str]) -> None:
    """Report the limits these routes' handlers charge after the session.

    Per-account write limits are charged inside their handlers, after the
    session; their headers are reported by the same layer.
    """
    app[REPORTED].update(names)


def setup(app: web.Application) -> None:
    """Open the limiter and add its layers; the routes come from the concerns."""
    api, settings = app[API], app[SETTINGS]
    routes = app[ROUTE_LIMITS] = {}
    names = app[REPORTED] = set()
    with api.placed("remembered_denials"):
        setup_remembered_denials(
            api,
            routes=routes,
            trusted_proxies=settings.trusted_proxies,
            security=app[SECURITY],
            origin=settings.base_url,
        )
    with api.placed("rate_headers"):
        setup_rate_headers(api, names=names)
    with api.placed("ratelimit"):
        setup_ratelimit(api, routes=routes)
    app.cleanup_ctx.append(limiter_ctx)
