"""The servers the benchmarks compare, each run alone in its own process.

`ours` is the real app from create_app. `bare` is a plain aiohttp app that returns
the same response, body and headers, from constants; `bare-body` returns only the
same body (the cost of the contract's headers shows as the gap between the two).
`limits` serves our square handler behind the `limits` library's async Redis
moving window instead of our limiter; `square-bare` returns the square's first
page from a constant; `square-bare-429` returns, from constants, the very
429 (body and headers) our app gives a flooding client. All use the same
run_app options and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.typedefs import Handler

from service.api.boundary import ApiBoundary
from service.api.errors import setup_errors
from service.app import create_app, freeze_startup_objects
from service.keys import SETTINGS
from service.settings import load_settings
from service.square.feed import list_square
from service.square.setup import square_ctx
from service.store.setup import redis_ctx

Captured = tuple[bytes, dict[str, str]]
# Set by aiohttp on every response; everything else is copied.
_PER_RESPONSE = {"Date", "Server", "Content-Length"}


def _loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def _capture(app: web.Application) -> dict[str, Captured]:
    """Fetch /en as HTML and as Markdown from the real app, in process."""
    captured = {}
    async with TestClient(TestServer(app)) as client:
        for name, accept in (("html", "text/html"), ("markdown", "text/markdown")):
            response = await client.get(
                "/en", headers={"Accept": accept, "Accept-Encoding": "identity"}
            )
            headers = {
                k: v for k, v in response.headers.items() if k not in _PER_RESPONSE
            }
            captured[name] = (await response.read(), headers)
    return captured


def bare_app(captured: dict[str, Captured], *, with_headers: bool) -> web.Application:
    """Return constant bytes, as the fastest possible aiohttp handler would."""
    (html, html_headers), (markdown, md_headers) = (
        captured["html"],
        captured["markdown"],
    )

    async def en_html(request: web.Request) -> web.Response:
        if with_headers:
            return web.Response(body=html, headers=html_headers)
        return web.Response(body=html, content_type="text/html", charset="utf-8")

    async def en_markdown(request: web.Request) -> web.Response:
        if with_headers:
            return web.Response(body=markdown, headers=md_headers)
        return web.Response(
            body=markdown, content_type="text/markdown", charset="utf-8"
        )

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/en", en_html)
    app.router.add_get("/en.md", en_markdown)
    return app


def limits_app(app: web.Application) -> web.Application:
    """Our square handler, limited by `limits` (moving window, Redis) instead."""
    from limits import RateLimitItemPerMinute
    from limits.aio.storage import RedisStorage
    from limits.aio.strategies import MovingWindowRateLimiter

    settings = app[SETTINGS]
    gallery = settings.limits["gallery"]
    item = RateLimitItemPerMinute(gallery.quota)
    storage = RedisStorage(settings.redis_url, implementation="redispy")
    limiter = MovingWindowRateLimiter(storage)

    def limits_layer(route: web.RouteDef, handler: Handler) -> Handler:
        async def limited(request: web.Request) -> web.StreamResponse:
            client = request.remote or "unknown"
            if not await limiter.hit(item, "gallery", client):
                raise web.HTTPTooManyRequests
            # Headers as Flask-Limiter and slowapi build them: one more round trip.
            stats = await limiter.get_window_stats(item, "gallery", client)
            response = await handler(request)
            response.headers["RateLimit-Policy"] = f'"gallery";q={gallery.quota};w=60'
            response.headers["RateLimit"] = f'"gallery";r={stats.remaining}'
            return response

        return limited

    api = ApiBoundary()
    setup_errors(api)
    api.add_layer(limits_layer)
    api.add_routes([web.get("/square", list_square)])
    limited = web.Application()
    limited[SETTINGS] = settings
    limited.cleanup_ctx.extend([redis_ctx, square_ctx])
    api.install(limited)
    limited.router.add_get("/healthz", _ok)
    return limited


async def _ok(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _capture_square(app: web.Application) -> tuple[bytes, dict[str, str]]:
    async with TestClient(TestServer(app)) as client:
        response = await client.get("/api/square")
        return await response.read(), {"Content-Type": "application/json"}


async def _capture_denial(app: web.Application) -> tuple[bytes, dict[str, str]]:
    async with TestClient(TestServer(app)) as client:
        for _ in range(3):
            response = await client.get("/api/square")
        assert response.status == 429
        headers = {k: v for k, v in response.headers.items() if k not in _PER_RESPONSE}
        return await response.read(), headers


def denial_bare_app(body: bytes, headers: dict[str, str]) -> web.Application:
    """Return our flood 429, byte for byte, from constants."""

    async def square(request: web.Request) -> web.Response:
        return web.Response(status=429, body=body, headers=headers)

    bare = web.Application()
    bare.router.add_get("/api/square", square)
    bare.router.add_get("/healthz", _ok)
    return bare


def square_bare_app(body: bytes) -> web.Application:
    """Return the square's first page from a constant."""

    async def square(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    bare = web.Application()
    bare.router.add_get("/api/square", square)
    bare.router.add_get("/healthz", _ok)
    return bare


def main() -> None:
    """Run one server until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "which",
        choices=[
            "ours",
            "bare",
            "bare-body",
            "limits",
            "square-bare",
            "square-bare-429",
        ],
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    app = create_app(settings)
    if args.which.startswith("bare"):
        captured = asyncio.run(_capture(create_app(settings)))
        app = bare_app(captured, with_headers=args.which == "bare")
    elif args.which == "limits":
        app = limits_app(app)
    elif args.which == "square-bare":
        body, _ = asyncio.run(_capture_square(create_app(settings)))
        app = square_bare_app(body)
    elif args.which == "square-bare-429":
        body, headers = asyncio.run(_capture_denial(create_app(settings)))
        app = denial_bare_app(body, headers)
    # Every server starts as `serve` does: start-up objects frozen out of the GC.
    app.on_startup.append(freeze_startup_objects)
    web.run_app(
        app,
        host="127.0.0.1",
        port=args.port,
        access_log=None,
        print=None,
        loop=_loop(args.loop),
    )


if __name__ == "__main__":
    main()
