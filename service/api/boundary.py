"""The /api boundary: every concern wraps each API handler once, at start-up.

aiohttp middlewares would run on every request of the whole application,
prepared public documents included, and would ask each request which route it
hit. Here each layer sees a route when it is registered and decides then
whether it applies, so a request only passes through the layers its route
needs, and nothing outside /api pays for any of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler

# A layer is given a route (with its own, unwrapped handler) and the handler
# of the layers below it, and returns what should run in their place.
Layer = Callable[[web.RouteDef, Handler], Handler]

API_PREFIX: Final = "/api"


def route_name(route: web.RouteDef) -> str:
    """Return a route's name, or "" for an unnamed one."""
    name = route.kwargs.get("name")
    return name if isinstance(name, str) else ""


class ApiBoundary:
    """Collect the API's layers, outermost first, and its routes."""

    def __init__(self, prefix: str = API_PREFIX) -> None:
        self.prefix = prefix
        self._layers: list[Layer] = []
        self._routes: list[web.RouteDef] = []

    def add_layer(self, layer: Layer) -> None:
        """Put a layer inside every layer added before it."""
        self._layers.append(layer)

    def add_routes(self, routes: Iterable[web.RouteDef]) -> None:
        """Take routes whose paths are relative to the prefix."""
        self._routes.extend(routes)

    def wrap(self, route: web.RouteDef) -> Handler:
        """Compose the layers around one route's handler, innermost last."""
        handler = route.handler
        for layer in reversed(self._layers):
            wrapped = layer(route, handler)
            if wrapped is not handler:
                functools.update_wrapper(wrapped, handler)
            handler = wrapped
        return handler

    def install(self, app: web.Application) -> None:
        """Register every route on the app, under the prefix, fully wrapped."""
        app.router.add_routes(
            web.RouteDef(
                route.method, self.prefix + route.path, self.wrap(route), route.kwargs
            )
            for route in self._routes
        )
