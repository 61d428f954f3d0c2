"""The /api boundary: layers composed per route, in order, and nothing elsewhere."""

from __future__ import annotations

import inspect

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient

from service.api.boundary import ApiBoundary, Layer, route_name
from service.app import create_app

from .conftest import SettingsFactory


def _tracing(label: str, seen: list[str]) -> Layer:
    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if route_name(route) == "untouched":
            return handler

        async def traced(request: web.Request) -> web.StreamResponse:
            seen.append(label)
            return await handler(request)

        return traced

    return layer


async def test_layers_run_outermost_first_and_skip_routes_they_leave_out(
    aiohttp_client: AiohttpClient,
) -> None:
    """The order of setup is the order of the chain; a layer may decline a route."""
    seen: list[str] = []

    async def ok(request: web.Request) -> web.StreamResponse:
        seen.append("handler")
        return web.json_response({"ok": True})

    api = ApiBoundary()
    for label in ("outer", "middle", "inner"):
        api.add_layer(_tracing(label, seen))
    api.add_routes(
        [web.get("/traced", ok, name="traced"), web.get("/plain", ok, name="untouched")]
    )
    app = web.Application()
    api.install(app)
    client = await aiohttp_client(app)

    assert (await client.get("/api/traced")).status == 200
    assert seen == ["outer", "middle", "inner", "handler"]
    seen.clear()
    assert (await client.get("/api/plain")).status == 200
    assert seen == ["handler"]
    seen.clear()
    assert (await client.head("/api/traced")).status == 200
    assert seen == ["outer", "middle", "inner", "handler"]


async def test_named_layers_compose_in_the_written_order_whoever_adds_them_first(
    aiohttp_client: AiohttpClient,
) -> None:
    """Concerns set up in any order; their layers still run in the boundary's order."""
    seen: list[str] = []

    async def ok(request: web.Request) -> web.StreamResponse:
        seen.append("handler")
        return web.json_response({"ok": True})

    api = ApiBoundary(order=("outer", "middle", "inner"))
    for label in ("inner", "outer", "middle"):
        with api.placed(label):
            api.add_layer(_tracing(label, seen))
    api.add_routes([web.get("/traced", ok, name="traced")])
    app = web.Application()
    api.install(app)
    client = await aiohttp_client(app)

    assert (await client.get("/api/traced")).status == 200
    assert seen == ["outer", "middle", "inner", "handler"]


def test_an_ordered_boundary_refuses_a_stray_a_twice_set_or_a_missing_layer() -> None:
    """A layer without a place, one placed twice, or one never set up stops start-up."""
    api = ApiBoundary(order=("errors", "sessions"))
    with pytest.raises(ValueError, match="only when placed"):
        api.add_layer(_tracing("stray", []))
    with (
        pytest.raises(ValueError, match="no API layer named 'csrf'"),
        api.placed("csrf"),
    ):
        pass
    with api.placed("errors"):
        api.add_layer(_tracing("errors", []))
    with pytest.raises(ValueError, match="'errors' set up twice"), api.placed("errors"):
        pass
    with pytest.raises(ValueError, match="API layers never set up: sessions"):
        api.install(web.Application())


def test_a_wrapped_handler_unwraps_to_the_declared_one() -> None:
    """Tools that look for a marker on a handler can see through the layers."""

    async def declared(request: web.Request) -> web.StreamResponse:
        return web.Response()

    api = ApiBoundary()
    api.add_layer(_tracing("one", []))
    api.add_layer(_tracing("two", []))
    route = web.get("/x", declared, name="x")
    wrapped = api.wrap(route)
    assert wrapped is not declared
    assert inspect.unwrap(wrapped) is declared


def test_the_app_has_no_aiohttp_middleware_signal_or_sub_app(
    make_settings: SettingsFactory,
) -> None:
    """Any of these would put a per-request cost on every public document, and
    handlers find the service's state on `request.app`, which is all of it only
    while there is no sub-application."""
    app = create_app(make_settings())
    app.freeze()
    assert not app.middlewares
    assert not app.on_response_prepare
    assert not any(
        isinstance(resource, web.PrefixedSubAppResource)
        for resource in app.router.resources()
    )
    api_paths = {
        resource.canonical
        for resource in app.router.resources()
        if resource.canonical.startswith("/api/")
    }
    assert api_paths == {
        "/api/auth/code",
        "/api/auth/verify",
        "/api/auth/logout",
        "/api/auth/logout-everywhere",
        "/api/me",
        "/api/square",
        "/api/square/{work_id}",
        "/api/square/{work_id}/report",
        "/api/reports/{report_id}",
        "/api/models",
        "/api/credits",
        "/api/generations",
        "/api/generations/{gid}",
        "/api/generations/{gid}/cancel",
        "/api/generations/{gid}/retry",
        "/api/generations/cancel",
        "/api/presets",
        "/api/collections",
        "/api/collections/{cid}",
        "/api/collections/{cid}/works/{wid}",
        "/api/credits/daily",
        "/api/uploads",
        "/api/events",
        "/api/works",
        "/api/works/{wid}",
        "/api/works/{wid}/publish",
        "/api/works/{wid}/favorite",
        "/api/works/{wid}/report",
        "/api/favorites",
        "/api/packs",
        "/api/orders",
        "/api/orders/{oid}",
        "/api/orders/{oid}/qrcode",
        "/api/account/export",
        "/api/account/exports/{eid}",
        "/api/account/exports/{eid}/file",
        "/api/account/delete",
    }
