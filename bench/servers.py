"""The servers the benchmarks compare, each run alone in its own process.

`ours` is the real app from create_app. `bare` is a plain aiohttp app that returns
the same response, body and headers, from constants; `bare-body` returns only the
same body (the cost of the contract's headers shows as the gap between the two).
All use the same run_app options and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from service.app import create_app
from service.settings import load_settings

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


def main() -> None:
    """Run one server until killed."""
    parser = argparse.ArgumentParser()
    parser.add_argument("which", choices=["ours", "bare", "bare-body"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    app = create_app(settings)
    if args.which.startswith("bare"):
        captured = asyncio.run(_capture(create_app(settings)))
        app = bare_app(captured, with_headers=args.which == "bare")
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
