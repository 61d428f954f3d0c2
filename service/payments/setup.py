"""Buying credits: providers and orders, their /api routes, the providers' notices."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from ..api.boundary import API
from ..keys import SETTINGS
from ..limits.setup import report_limits
from ..studio.keys import EVENT_VIEWS
from .context import payments_ctx
from .endpoints import ORDER_LIMITED, setup_order_routes
from .orders import view
from .qrcode import setup_qrcode_routes
from .webhooks import setup_webhook_routes


def _order_event(data: dict[str, Any]) -> dict[str, Any]:
    """Show an order's change on the account's event stream as the API shows it."""
    return view(data, time.time())


def setup(app: web.Application) -> None:
    """Register the orders' routes and the providers' notices; open the providers."""
    setup_order_routes(app[API])
    setup_qrcode_routes(app[API])
    report_limits(app, ORDER_LIMITED)
    app[EVENT_VIEWS]["order"] = _order_event
    # The providers' notices: outside /api (no session, no cross-origin check).
    setup_webhook_routes(app)
    if app[SETTINGS].payments.fake:  # its pages and gateways; never in production
        from .fake_routes import setup_fake_provider

        setup_fake_provider(app)
    app.cleanup_ctx.append(payments_ctx)
