"""Unknown paths, wrong methods and crashes: right status, clear body, no traceback."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from pytest_aiohttp import AiohttpClient

from service.api.boundary import ApiBoundary
from service.api.errors import ApiError, setup_errors
from service.web.hardening import answer_own_errors_in_json

from .conftest import Client
from .logs import troubles
from .raw_http import abandon, exchange


async def test_unknown_api_path_answers_json_not_found(client: Client) -> None:
    """Under /api/ every error is JSON."""
    for method in ("GET", "POST", "DELETE"):
        for path in ("/api", "/api/", "/api/does-not-exist", "/api/auth/nothing"):
            response = await client.request(method, path)
            assert response.status == 404, path
            assert await response.json() == {"error": "NOT_FOUND"}
        response = await client.request(method, "/api/does-not-exist")
        assert response.status == 404
        assert response.headers["Content-Type"] == "application/json"
        assert await response.json() == {"error": "NOT_FOUND"}


async def test_unknown_page_answers_an_html_page(client: Client) -> None:
    """Elsewhere a 404 is a page a person can read, in both languages."""
    response = await client.get("/does-not-exist")
    assert response.status == 404
    assert response.headers["Content-Type"] == "text/html; charset=utf-8"
    text = await response.text()
    assert "404 Not Found" in text
    assert "This address has no page." in text


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/api/auth/code", {"POST"}),
        ("DELETE", "/api/auth/verify", {"POST"}),
        ("POST", "/api/square", {"GET", "HEAD"}),
        ("PUT", "/api/square/w1", {"GET", "HEAD"}),
        ("POST", "/api/me", {"GET", "HEAD"}),
        # The providers' notice paths are machines' too (issue 23's fuzz).
        ("GET", "/webhooks/alipay", {"POST"}),
        ("TRACE", "/webhooks/wechatpay", {"POST"}),
    ],
)
async def test_wrong_method_on_an_api_path_is_json_405_with_allow(
    client: Client, method: str, path: str, allow: set[str]
) -> None:
    """The API names the methods a path takes, in JSON, before any layer runs."""
    response = await client.request(method, path)
    assert response.status == 405
    assert set(response.headers["Allow"].split(",")) == allow
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert "RateLimit" not in response.headers
    assert await response.json() == {"error": "METHOD_NOT_ALLOWED"}


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
async def test_wrong_method_on_a_public_path_is_405_with_allow(
    client: Client, method: str
) -> None:
    """Public endpoints are GET and HEAD only, and say so."""
    for path in ("/", "/healthz", "/robots.txt"):
        response = await client.request(method, path)
        assert response.status == 405
        assert set(response.headers["Allow"].split(",")) == {"GET", "HEAD"}


def _crashing_app() -> web.Application:
    async def crash(request: web.Request) -> web.StreamResponse:
        raise RuntimeError("secret internal detail")

    async def domain(request: web.Request) -> web.StreamResponse:
        raise ApiError(409, "CONFLICT", headers={"X-Why": "test"}, hint="retry")

    api = ApiBoundary()
    setup_errors(api)
    api.add_routes([web.get("/crash", crash), web.get("/domain", domain)])
    app = web.Application()
    api.install(app)
    return app


async def test_a_crash_becomes_a_500_without_traceback(
    aiohttp_client: AiohttpClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The client sees a code, the log keeps the traceback."""
    client = await aiohttp_client(_crashing_app())
    with caplog.at_level(logging.ERROR, logger="service.api.errors"):
        response = await client.get("/api/crash")
    assert response.status == 500
    assert await response.json() == {"error": "INTERNAL_ERROR"}
    assert "secret internal detail" not in await response.text()
    assert "secret internal detail" in caplog.text


async def test_a_client_that_leaves_mid_body_is_not_a_store_outage(
    client: Client, caplog: pytest.LogCaptureFixture
) -> None:
    """A body cut short by a closed connection: an info line, no 503, no warning."""
    caplog.set_level(logging.INFO)
    await abandon(
        client.make_url("/"),
        b"POST /api/auth/code HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{}",
    )
    for _ in range(250):
        if "client left" in caplog.text:
            break
        await asyncio.sleep(0.02)
    assert "client left during POST /api/auth/code" in caplog.text
    assert troubles(caplog) == []


async def test_domain_errors_keep_their_code_headers_and_fields(
    aiohttp_client: AiohttpClient,
) -> None:
    """ApiError is turned into HTTP at the one boundary."""
    client = await aiohttp_client(_crashing_app())
    response = await client.get("/api/domain")
    assert response.status == 409
    assert response.headers["X-Why"] == "test"
    assert response.headers["Cache-Control"] == "no-store"
    assert await response.json() == {"error": "CONFLICT", "hint": "retry"}


# Requests aiohttp's parser refuses before any route: each carries a marker
# that its old text answer quoted back.
_UNPARSABLE = (
    b"GET /x HTTP/1.1 MARK\r\n\r\n",
    b"MARK\x00 / HTTP/1.1\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\r\nMARK Header\r\n\r\n",
    b"GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: MARK\r\n\r\n",
    b"GET /MARK" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n",
    b"POST /api/auth/code HTTP/1.1\r\nHost: a\r\n"
    b"Transfer-Encoding: chunked\r\n\r\nMARK\r\n",
)


@pytest.fixture
def json_own_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """aiohttp's own answers in JSON, as `serve` and `dev` make them, for one test."""
    monkeypatch.setattr(RequestHandler, "handle_error", RequestHandler.handle_error)
    answer_own_errors_in_json()
    answer_own_errors_in_json()  # twice is once


@pytest.mark.usefixtures("json_own_errors")
async def test_a_request_the_parser_refuses_is_answered_in_json_without_its_bytes(
    client: Client,
) -> None:
    """400 {"error": "BAD_REQUEST"}, never the request's own bytes, then closed."""
    for raw in _UNPARSABLE:
        answer = await exchange(client.make_url("/"), raw)  # read until closed
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        assert lines[0].startswith("http/1.0 400 "), raw
        assert "content-type: application/json" in lines
        assert "cache-control: no-store" in lines
        assert json.loads(body) == {"error": "BAD_REQUEST"}
        assert b"MARK" not in answer


@pytest.mark.usefixtures("json_own_errors")
async def test_a_crash_outside_the_api_boundary_is_a_json_500(
    aiohttp_client: AiohttpClient,
) -> None:
    """Even for a browser that asks for HTML: no traceback, no aiohttp page."""

    async def broken(request: web.Request) -> web.StreamResponse:
        raise RuntimeError("a bug")

    app = web.Application()
    app.router.add_get("/broken", broken)
    client = await aiohttp_client(app)
    response = await client.get("/broken", headers={"Accept": "text/html"})
    assert response.status == 500
    assert response.headers["Content-Type"] == "application/json"
    assert await response.json() == {"error": "INTERNAL_ERROR"}
