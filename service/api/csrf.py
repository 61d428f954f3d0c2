"""Refuse cross-origin state changes before anything reads their body."""

from __future__ import annotations

from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from .boundary import ApiBoundary
from .errors import ApiError

_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_FOREIGN_SITES: Final = frozenset({"cross-site", "same-site"})


def state_changing(route: web.RouteDef) -> bool:
    """Tell whether the cross-origin check guards this route."""
    return route.method not in _SAFE_METHODS


def cross_origin(request: web.BaseRequest, origin: str) -> bool:
    """Tell whether a browser sent this request from another site.

    Browsers send Sec-Fetch-Site on every request; `cross-site` and `same-site`
    are foreign. Older browsers send only Origin, which must then be ours.
    Requests with neither come from non-browser clients, which hold no
    ambient cookie a third party could ride on, and pass.
    """
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site.strip().lower() in _FOREIGN_SITES
    sent = request.headers.get("Origin")
    return sent is not None and sent != origin


def setup_csrf(api: ApiBoundary, *, origin: str) -> None:
    """Refuse a cross-origin request (above) on every state-changing route."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if not state_changing(route):
            return handler

        async def same_origin(request: web.Request) -> web.StreamResponse:
            """Answer 403 CROSS_ORIGIN to a foreign state-changing request."""
            if cross_origin(request, origin):
                raise ApiError(403, "CROSS_ORIGIN")
            return await handler(request)

        return same_origin

    api.add_layer(layer)
