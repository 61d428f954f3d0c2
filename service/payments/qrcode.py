"""The QR code a desktop buyer scans with WeChat, drawn here: no third party sees it."""

from __future__ import annotations

import io
import json
from typing import Final

from aiohttp import web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..auth.sessions import SESSION
from . import orders
from .keys import ORDERS

SVG_TYPE: Final = "image/svg+xml"
# A code_url lives as long as its order (15 minutes); only its buyer may keep it.
CACHE_CONTROL: Final = "private, max-age=900"
# The quiet zone ISO/IEC 18004 asks for, in modules.
BORDER: Final = 4


def qr_svg(text: str) -> bytes:
    """Draw text as a QR code: black modules on white, scalable (a viewBox, no size)."""
    import segno  # here: only a process that draws a code loads it

    code = segno.make(text, error="m", micro=False)
    out = io.BytesIO()
    code.save(
        out,
        kind="svg",
        border=BORDER,
        dark="#000",
        light="#fff",
        omitsize=True,
        xmldecl=False,
    )
    return out.getvalue()


def code_url_of(fields: dict[str, str] | None) -> str | None:
    """Return the code_url an order's provider gave to scan, or None if it gave none."""
    if not fields:
        return None
    try:
        action = json.loads(fields.get("action") or "null")
    except ValueError:
        return None
    if not isinstance(action, dict) or action.get("type") != "qrcode":
        return None
    url = action.get("code_url")
    return url if isinstance(url, str) and url else None


async def order_qrcode(request: web.Request) -> web.StreamResponse:
    """Answer the SVG QR code of one of my orders whose action is a QR."""
    oid = request.match_info["oid"]
    if orders.account_of(oid) != request[SESSION].account_id:
        raise ApiError(404, "NOT_FOUND")
    url = code_url_of(await request.app[ORDERS].get(oid))
    if url is None:
        raise ApiError(404, "NOT_FOUND")
    return web.Response(
        body=qr_svg(url),
        content_type=SVG_TYPE,
        headers={"Cache-Control": CACHE_CONTROL},
    )


def setup_qrcode_routes(api: ApiBoundary) -> None:
    """Register GET /api/orders/{oid}/qrcode behind the /api boundary."""
    api.add_routes([web.get("/orders/{oid}/qrcode", order_qrcode, name="order_qrcode")])
