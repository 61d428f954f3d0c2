"""Unknown paths, wrong methods and crashes: right status, clear body, no traceback."""

from __future__ import annotations

import asyncio
import logging

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpClient

from service.api.boundary import ApiBoundary
from service.api.errors import ApiError, setup_errors

from .conftest import Client
from .logs import troubles
from .raw_http import abandon


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
