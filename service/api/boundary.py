"""The /api boundary: every concern wraps each API handler once, at start-up.

aiohttp middlewares would run on every request of the whole application,
prepared public documents included, and would ask each request which route it
hit. Here each layer sees a route when it is registered and decides then
whether it applies, so a request only passes through the layers its route
needs, and nothing outside /api pays for any of them.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterable, Iterator, Sequence
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
    """Collect the API's layers, outermost first, and its routes.

    With an `order` (the names of the layers, outermost first), each concern
    adds its own layers inside `placed(name)`, in whatever order the concerns
    are set up, and the layers still compose in the one order written down.
    """

    def __init__(self, prefix: str = API_PREFIX, *, order: Sequence[str] = ()) -> None:
        self.prefix = prefix
        self._order = {name: rank for rank, name in enumerate(order)}
        self._place: str | None = None
        self._layers: list[tuple[int, Layer]] = []
        self._placed: set[str] = set()
        self._routes: list[web.RouteDef] = []

    @contextlib.contextmanager
    def placed(self, name: str) -> Iterator[None]:
        """Put the layers added inside this block at their named place."""
        if name not in self._order:
            raise ValueError(f"no API layer named {name!r} in the order")
        if name in self._placed:
            raise ValueError(f"API layer {name!r} set up twice")
        self._place = name
        try:
            yield
        finally:
            self._place = None
            self._placed.add(name)

    def add_layer(self, layer: Layer) -> None:
        """Put a layer inside every layer added before it (or at its place)."""
        if self._order and self._place is None:
            raise ValueError("an ordered API boundary takes layers only when placed")
        rank = len(self._layers) if self._place is None else self._order[self._place]
        self._layers.append((rank, layer))
        self._layers.sort(key=lambda ranked: ranked[0])

    def add_routes(self, routes: Iterable[web.RouteDef]) -> None:
        """Take routes whose paths are relative to the prefix."""
        self._routes.extend(routes)

    def wrap(self, route: web.RouteDef) -> Handler:
        """Compose the layers around one route's handler, innermost last."""
        handler = route.handler
        for _, layer in reversed(self._layers):
            wrapped = layer(route, handler)
            if wrapped is not handler:
                functools.update_wrapper(wrapped, handler)
            handler = wrapped
        return handler

    def install(self, app: web.Application) -> None:
        """Register every route on the app, under the prefix, fully wrapped."""
        if missing := [name for name in self._order if name not in self._placed]:
            raise ValueError(f"API layers never set up: {', '.join(missing)}")
        app.router.add_routes(
            web.RouteDef(
                route.method, self.prefix + route.path, self.wrap(route), route.kwargs
            )
            for route in self._routes
        )


# The application's one boundary: every concern adds its routes and layers to it.
API: Final = web.AppKey("api", ApiBoundary)
