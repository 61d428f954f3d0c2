"""Security headers reach every answer: documents, files, errors and 304s."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from pytest_aiohttp import AiohttpClient

from service.app import create_app
from service.web.routes import PUBLIC_ROUTES
from service.web.setup import TEMPLATES_DIR

from .conftest import Client, SettingsFactory

PATHS = [route.path for route in PUBLIC_ROUTES] + ["/missing", "/api/missing"]


@pytest.mark.parametrize("path", PATHS)
async def test_every_response_carries_nosniff_and_referrer_policy(
    client: Client, path: str
) -> None:
    """Public endpoints and error answers alike."""
    response = await client.get(path)
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "strict-origin-when-cross-origin"
    assert "Strict-Transport-Security" not in response.headers
    is_html = response.headers["Content-Type"].startswith("text/html")
    assert ("Content-Security-Policy" in response.headers) is is_html


async def test_html_policy_allows_our_stylesheet_and_no_script(client: Client) -> None:
    """The CSP pins the inline stylesheet by hash and has no unsafe-inline at all."""
    response = await client.get("/")
    csp = response.headers["Content-Security-Policy"]
    assert "unsafe-inline" not in csp
    assert "script-src" not in csp
    assert "default-src 'none'" in csp
    style = re.search(r"<style>(.*?)</style>", await response.text(), re.DOTALL)
    assert style
    digest = base64.b64encode(hashlib.sha256(style.group(1).encode()).digest()).decode()
    assert f"style-src 'sha256-{digest}'" in csp
    assert style.group(1) == (TEMPLATES_DIR / "site.css").read_text()


async def test_https_base_url_adds_hsts(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory
) -> None:
    """Strict-Transport-Security appears only when the public origin is https."""
    app = create_app(make_settings(STUDIO_BASE_URL="https://studio.example.com"))
    client = await aiohttp_client(app)
    for path in ("/", "/healthz", "/missing"):
        response = await client.get(path)
        assert response.headers["Strict-Transport-Security"].startswith("max-age=")
    link = (await client.get("/en")).headers["Link"]
    assert "<https://studio.example.com/en>" in link
