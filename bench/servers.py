"""The servers the benchmarks compare, each run alone in its own process.

`ours` is the real app from create_app; `bare` is a plain aiohttp app that returns
the same bytes from constants. Both use the same run_app options and event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from aiohttp import web

from service.app import create_app
from service.settings import load_settings


def _loop(kind: str) -> asyncio.AbstractEventLoop:
    if kind == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


async def _document_bytes(app: web.Application) -> dict[str, bytes]:
    """Fetch /en as HTML and as Markdown from the real app, in process."""
    from aiohttp.test_utils import TestClient, TestServer

    bodies = {}
    async with TestClient(TestServer(app)) as client:
        for name, accept in (("html", "text/html"), ("markdown", "text/markdown")):
            response = await client.get(
                "/en", headers={"Accept": accept, "Accept-Encoding": "identity"}
            )
            bodies[name] = await response.read()
    return bodies


def bare_app(bodies: dict[str, bytes]) -> web.Application:
    """Return constant bytes, as the fastest possible aiohttp handler would."""
    html, markdown = bodies["html"], bodies["markdown"]

    async def en_html(request: web.Request) -> web.Response:
        return web.Response(body=html, content_type="text/html", charset="utf-8")

    async def en_markdown(request: web.Request) -> web.Response:
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
    parser.add_argument("which", choices=["ours", "bare"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    app = create_app(settings)
    if args.which == "bare":
        bodies = asyncio.run(_document_bytes(create_app(settings)))
        app = bare_app(bodies)
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
