"""The WeChat QR code of an order: drawn on the server, only for its buyer."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator
from typing import Any

import pytest
import segno
from aiohttp.test_utils import TestClient, TestServer
from redis.asyncio import Redis

from service.app import create_app
from service.payments.qrcode import BORDER, qr_svg

from .conftest import Client, SettingsFactory
from .ports import free_port
from .workbench import sign_in

SVG = "{http://www.w3.org/2000/svg}"
_STEP = re.compile(r"([MmHhVv])\s*(-?\d+(?:\.\d+)?)(?:[ ,](-?\d+(?:\.\d+)?))?")


@pytest.fixture
async def shop(make_settings: SettingsFactory, redis: Redis) -> AsyncIterator[Client]:
    """The real app with the fake provider playing both channels, at its base URL."""
    port = free_port()  # the adapters call the fake gateway at the base URL
    settings = make_settings(
        STUDIO_PAYMENTS_FAKE="1", STUDIO_BASE_URL=f"http://127.0.0.1:{port}"
    )
    client: Client = TestClient(TestServer(create_app(settings), port=port))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def dark_modules(svg: bytes) -> set[tuple[int, int]]:
    """Read back which modules an SVG QR code paints dark (its stroked path)."""
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    paths = [p for p in root.iter(f"{SVG}path") if p.get("stroke")]
    assert len(paths) == 1
    dark: set[tuple[int, int]] = set()
    x = y = 0.0
    for command, first, second in _STEP.findall(paths[0].get("d", "")):
        a = float(first)
        if command in "Mm":
            b = float(second)
            x, y = (a, b) if command == "M" else (x + a, y + b)
        elif command in "Hh":
            end = a if command == "H" else x + a
            # A line of width 1 through the middle of a row of modules.
            dark.update((int(col), int(y - 0.5)) for col in range(int(x), int(end)))
            x = end
        else:
            raise AssertionError(f"unexpected path command {command}")
    return dark


def expected_modules(text: str) -> tuple[set[tuple[int, int]], int]:
    """Return segno's own dark modules for text (quiet zone included) and the size."""
    code = segno.make(text, error="m", micro=False)
    dark = {
        (col + BORDER, row + BORDER)
        for row, line in enumerate(code.matrix)
        for col, bit in enumerate(line)
        if bit & 1
    }
    width, _ = code.symbol_size(border=BORDER)
    return dark, int(width)


async def order(client: Client, pack: str, channel: str) -> dict[str, Any]:
    response = await client.post(
        "/api/orders", json={"pack": pack, "channel": channel, "device": "desktop"}
    )
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    return body


def test_the_svg_encodes_exactly_the_text_it_was_given() -> None:
    """Module for module, the drawing is segno's QR code of the text."""
    text = "weixin://wxpay/bizpayurl?pr=AbCdEf1"
    svg = qr_svg(text)
    dark, width = expected_modules(text)
    assert dark_modules(svg) == dark
    assert ET.fromstring(svg).get("viewBox") == f"0 0 {width} {width}"
    assert dark_modules(qr_svg(text + "2")) != dark


async def test_a_wechat_order_on_a_desktop_serves_its_code_url_as_a_qr_code(
    shop: Client, mail_server: Any
) -> None:
    """The buyer's QR: SVG, private, cached no longer than the order lives."""
    await sign_in(shop, mail_server)
    wechat = await order(shop, "p98", "wechatpay")
    action = wechat["action"]
    assert action["type"] == "qrcode"
    response = await shop.get(f"/api/orders/{wechat['id']}/qrcode")
    assert response.status == 200
    assert response.headers["Content-Type"] == "image/svg+xml"
    assert response.headers["Cache-Control"] == "private, max-age=900"
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    svg = await response.read()
    dark, width = expected_modules(action["code_url"])
    assert dark_modules(svg) == dark
    assert ET.fromstring(svg).get("viewBox") == f"0 0 {width} {width}"
    # Asking again (a reload, a second tab) shows the same code.
    again = await shop.get(f"/api/orders/{wechat['id']}/qrcode")
    assert await again.read() == svg


async def test_no_qr_code_for_a_redirect_an_unknown_or_someone_elses_order(
    shop: Client, mail_server: Any
) -> None:
    """404 unless the order is mine and its provider asked for a QR; 401 signed out."""
    await sign_in(shop, mail_server)
    mine = await order(shop, "p98", "wechatpay")
    alipay = await order(shop, "p30", "alipay")
    assert alipay["action"]["type"] == "redirect"
    missing = mine["id"][:24] + "00000000"
    for oid in (alipay["id"], missing, "nonsense", mine["id"].upper()):
        response = await shop.get(f"/api/orders/{oid}/qrcode")
        assert response.status == 404, oid
        assert await response.json() == {"error": "NOT_FOUND"}

    shop.session.cookie_jar.clear()
    anonymous = await shop.get(f"/api/orders/{mine['id']}/qrcode")
    assert anonymous.status == 401
    assert await anonymous.json() == {"error": "NO_SESSION"}
    await sign_in(shop, mail_server)
    other = await shop.get(f"/api/orders/{mine['id']}/qrcode")
    assert other.status == 404
    assert await other.json() == {"error": "NOT_FOUND"}
