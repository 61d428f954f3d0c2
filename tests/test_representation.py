"""Prepared and direct responses send, byte for byte, what aiohttp's own path would."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import AsyncIterator

import pytest
from aiohttp import hdrs, web, web_response
from aiohttp.test_utils import TestServer

from service.web.headers import SecurityHeaders
from service.web.representation import (
    DirectResponse,
    PreparedResponse,
    Variant,
    json_head,
    prepare,
)

_DATE = re.compile(rb"\r\nDate: [^\r]*\r\n")
# How a direct answer's own headers are given (see _answered).
SHAPES = ("dict", "head", "dated")


def _variant() -> Variant:
    security = SecurityHeaders(https=False, csp="default-src 'self'")
    body = "<!doctype html><p>流光 " + "x" * 600
    rep = prepare(body.encode(), "text/html; charset=utf-8", security=security)
    return rep.identity


def _denial() -> Variant:
    """A 429 as the remembered denials send it: problem+json, not cached."""
    headers = {
        "Content-Type": "application/problem+json",
        "Cache-Control": "no-store",
        "Retry-After": "7",
    }
    return Variant(body=b'{"error": "RATE_LIMITED"}', headers=headers, status=429)


def _answered(
    kind: type[web.Response], status: int, shape: str = "dict"
) -> web.Response:
    """An /api JSON answer as its handler and the layers leave it.

    Its own headers are given as a dict and a content type, as json_head
    builds them once, or with a Date of the handler's own (aiohttp's path).
    """
    body = '{"items": ["流光"]}'.encode()
    if shape == "head":
        response = kind(status=status, body=body, headers=json_head("no-store"))
    else:
        headers = {"Cache-Control": "no-store"}
        if shape == "dated":
            headers["Date"] = "Sun, 06 Nov 1994 08:49:37 GMT"
        response = kind(
            status=status, body=body, content_type="application/json", headers=headers
        )
    response.headers.update({"RateLimit-Policy": '"a";q=9;w=60', "RateLimit": "x"})
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    app = web.Application()
    for name, variant in (("", _variant()), ("429", _denial())):

        async def fast(request: web.Request, v: Variant = variant) -> web.Response:
            return PreparedResponse(v)

        async def plain(request: web.Request, v: Variant = variant) -> web.Response:
            return web.Response(status=v.status, body=v.body, headers=v.headers)

        app.router.add_get(f"/fast{name}", fast)
        app.router.add_get(f"/plain{name}", plain)
    for status, shape in itertools.product((200, 202, 429), SHAPES):

        async def direct(
            request: web.Request, s: int = status, h: str = shape
        ) -> web.Response:
            return _answered(DirectResponse, s, h)

        async def aiohttps(
            request: web.Request, s: int = status, h: str = shape
        ) -> web.Response:
            return _answered(web.Response, s, h)

        for method in ("GET", "POST", "DELETE"):
            app.router.add_route(method, f"/fast-{shape}{status}", direct)
            app.router.add_route(method, f"/plain-{shape}{status}", aiohttps)
    test_server = TestServer(app)
    await test_server.start_server()
    yield test_server
    await test_server.close()


async def _exchange(server: TestServer, request: bytes) -> bytes:
    """Send one raw request and read its whole answer."""
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        match = re.search(rb"Content-Length: (\d+)", head)
        length = int(match.group(1)) if match else 0
        body = await reader.readexactly(length) if b"HEAD " not in request else b""
        return head + body
    finally:
        writer.close()
        await writer.wait_closed()


async def _both(
    server: TestServer, template: bytes, suffix: bytes = b""
) -> tuple[bytes, bytes]:
    """Fetch /fast and /plain alike, with their Date lines made equal."""
    fast = await _exchange(server, template.replace(b"PATH", b"/fast" + suffix))
    plain = await _exchange(server, template.replace(b"PATH", b"/plain" + suffix))
    return _DATE.sub(b"\r\nDate: -\r\n", fast), _DATE.sub(b"\r\nDate: -\r\n", plain)


TEMPLATES = pytest.mark.parametrize(
    "template",
    [
        b"GET PATH HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD PATH HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET PATH HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET PATH HTTP/1.0\r\nHost: x\r\n\r\n",
        b"GET PATH HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n\r\n",
    ],
    ids=["get", "head", "close", "http10", "http10-keep-alive"],
)


@TEMPLATES
async def test_a_prepared_response_sends_the_bytes_aiohttp_would(
    server: TestServer, template: bytes
) -> None:
    fast, plain = await _both(server, template)
    assert fast == plain
    assert b"Content-Length: " in fast or b"HEAD" in template


@TEMPLATES
async def test_a_prepared_429_sends_the_bytes_aiohttp_would(
    server: TestServer, template: bytes
) -> None:
    fast, plain = await _both(server, template, b"429")
    assert fast == plain
    assert re.match(rb"HTTP/1\.[01] 429 Too Many Requests\r\n", fast)


async def test_the_cached_head_is_rebuilt_when_its_second_has_passed() -> None:
    variant = _variant()
    first = variant.head()
    assert variant.head() is first  # the same second: the same bytes object
    variant._head[0] = (b"Date: Thu, 01 Jan 1970 00:00:00 GMT\r\n", b"stale")
    fresh = variant.head()
    assert fresh.startswith(b"HTTP/1.1 200 OK\r\n")
    server_name = vars(web_response)["SERVER_SOFTWARE"]
    assert f"Server: {server_name}\r\n".encode() in fresh
    assert b"Thu, 01 Jan 1970" not in fresh


@pytest.mark.parametrize("kind", ["prepared", "direct"])
async def test_a_renamed_server_is_named_at_once_not_a_second_later(
    server: TestServer, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    # hardening.py renames Server at start-up; tests rename it within a second.
    path = b"/fast" if kind == "prepared" else b"/fast-head200"
    request = b"GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path
    before = await _exchange(server, request)
    monkeypatch.setattr(web_response, "SERVER_SOFTWARE", "renamed-now")
    after = await _exchange(server, request)
    assert b"\r\nServer: renamed-now\r\n" not in before
    assert b"\r\nServer: renamed-now\r\n" in after


async def test_a_header_with_a_line_break_is_refused_when_the_head_is_built() -> None:
    variant = Variant(body=b"x", headers={"X-Bad": "a\r\nb"}, not_modified={})
    with pytest.raises(ValueError, match="line break"):
        variant.head()


@pytest.mark.parametrize("status", [200, 202, 429])
@pytest.mark.parametrize(
    "template",
    [
        b"GET PATH HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HEAD PATH HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST PATH HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}",
        b"DELETE PATH HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET PATH HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"GET PATH HTTP/1.0\r\nHost: x\r\n\r\n",
        b"POST PATH HTTP/1.0\r\nHost: x\r\nConnection: keep-alive\r\n"
        b"Content-Length: 0\r\n\r\n",
    ],
    ids=["get", "head", "post", "delete", "close", "http10", "http10-keep-alive"],
)
@pytest.mark.parametrize("shape", SHAPES)
async def test_a_direct_response_sends_the_bytes_aiohttp_would(
    server: TestServer, template: bytes, status: int, shape: str
) -> None:
    path = b"PATH-%s%d" % (shape.encode(), status)
    fast, plain = await _both(server, template.replace(b"PATH", path))
    assert fast == plain
    assert fast.startswith(b"HTTP/1.")
    assert b"Content-Length: " in fast


@pytest.mark.parametrize(
    ("template", "direct"),
    [
        (b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n", True),
        (b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", True),
        (b"HEAD /a HTTP/1.1\r\nHost: x\r\n\r\n", False),
        (b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", False),
        (b"GET /a HTTP/1.0\r\nHost: x\r\n\r\n", False),
    ],
    ids=["get", "post", "head", "close", "http10"],
)
async def test_the_common_path_writes_the_head_without_aiohttps_own_steps(
    template: bytes, direct: bool
) -> None:
    # aiohttp's own path adds Content-Length, Date and Server to the headers
    # before serializing them; the direct one writes those lines itself.
    sent: list[web.Response] = []

    async def handler(request: web.Request) -> web.Response:
        sent.append(_answered(DirectResponse, 200, "head"))
        return sent[-1]

    app = web.Application()
    app.router.add_route("*", "/a", handler)
    test_server = TestServer(app)
    await test_server.start_server()
    try:
        answer = await _exchange(test_server, template)
    finally:
        await test_server.close()
    assert re.match(rb"HTTP/1\.[01] 200 OK\r\n", answer)
    assert (hdrs.DATE not in sent[0].headers) is direct
