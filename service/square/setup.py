"""The square: its store, its /api routes and limits, and its public work pages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp_jinja2
from aiohttp import web

from ..api.boundary import API
from ..keys import REDIS, SETTINGS
from ..limits.http import RouteLimit
from ..limits.setup import limit_routes
from ..web.keys import ERROR_PAGES, SECURITY, TEMPLATE_CONTEXT
from .feed import SQUARE, VERSION, SquareStore, setup_square_routes
from .page import work_page_handler


async def square_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the square's store on the app's Redis client."""
    budget = app[SETTINGS].workbench.square_read_budget
    app[SQUARE] = SquareStore(app[REDIS], budget)
    yield


def setup(app: web.Application) -> None:
    """Register the square's routes, their limits and its store."""
    limits = app[SETTINGS].limits
    # The square fails open (a local bucket) when Redis is gone: browsing is
    # harmless. The square's version rides along with the gallery decision, so
    # a cached page is checked against removals at no extra round trip.
    gallery = RouteLimit((limits["gallery"],), fail_open=True, read_along=VERSION)
    limit_routes(app, {"square_list": gallery, "square_item": gallery})
    setup_square_routes(app[API])
    not_found = app[ERROR_PAGES][404]
    app.router.add_get(
        "/square/{work_id}",
        work_page_handler(
            aiohttp_jinja2.get_env(app),
            app[TEMPLATE_CONTEXT],
            app[SECURITY],
            web.Response(body=not_found.body, headers=not_found.headers),
        ),
        name="square_page",
    )
    app.cleanup_ctx.append(square_ctx)
