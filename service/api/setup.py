"""The /api boundary's own layers, and its installation once every concern is in."""

from __future__ import annotations

from aiohttp import web

from ..keys import SETTINGS
from ..web.keys import ERROR_PAGES, SECURITY
from .boundary import API
from .cookies_layer import setup_cookie_bound
from .csrf import setup_csrf
from .errors import FALLBACK, fallback_handler, setup_errors


def setup(app: web.Application) -> None:
    """Turn failures into JSON, bound the cookies, refuse cross-origin writes."""
    api = app[API]
    with api.placed("errors"):
        setup_errors(api)
    with api.placed("cookie_bound"):
        setup_cookie_bound(api)
    with api.placed("csrf"):
        setup_csrf(api, origin=app[SETTINGS].base_url)


def install(app: web.Application) -> None:
    """Register every /api route, wrapped, then the catch-all that answers the rest.

    Last of all: the fallback takes whatever no route before it took.
    """
    app[API].install(app)
    pages = app[ERROR_PAGES]
    fallback = fallback_handler(pages, app[SECURITY])
    app.router.add_route("*", "/{tail:.*}", fallback, name=FALLBACK)
