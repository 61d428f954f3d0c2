"""Refuse cross-origin state changes before anything reads their body."""

from __future__ import annotations

from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

from .boundary import ApiBoundary
from .errors import ApiError

_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS", "TRACE"})
_FOREIGN_SITES: Final = frozenset({"cross-site", "same-site"})


def setup_csrf(api: ApiBoundary, *, origin: str) -> None:
    """Check Sec-Fetch-Site, else Origin, on every state-changing route.

    Browsers send Sec-Fetch-Site on every request; `cross-site` and `same-site`
    are refused. Older browsers send only Origin, which must then be ours.
    Requests with neither come from non-browser clients, which hold no
    ambient cookie a third party could ride on, and pass.
    """

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if route.method in _SAFE_METHODS:
            return handler

        async def same_origin(request: web.Request) -> web.StreamResponse:
            """Answer 403 CROSS_ORIGIN to a foreign state-changing request."""
            site = request.headers.get("Sec-Fetch-Site")
            if site is not None:
                if site.strip().lower() in _FOREIGN_SITES:
                    raise ApiError(403, "CROSS_ORIGIN")
            elif (sent := request.headers.get("Origin")) is not None and sent != origin:
                raise ApiError(403, "CROSS_ORIGIN")
            return await handler(request)

        return same_origin

    api.add_layer(layer)
