"""Signing in: codes, devices, accounts and sessions, the mailer, the session layer."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from ..api.boundary import API
from ..keys import REDIS, SETTINGS
from ..limits.http import RouteLimit
from ..limits.setup import limit_routes
from ..studio.keys import LEDGER
from .accounts import AccountStore
from .codes import CodeStore
from .devices import DeviceStore
from .endpoints import setup_auth_routes
from .identity import Keyring
from .keys import ACCOUNTS, CODES, DEVICES
from .mailer import mailer_ctx
from .sessions import SESSIONS, SessionStore, session_cache_ctx, setup_sessions


async def stores_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the codes, devices, accounts and sessions on the app's Redis."""
    settings, client = app[SETTINGS], app[REDIS]
    app[CODES] = CodeStore(client, settings.secret_key)
    app[DEVICES] = DeviceStore(client)
    keyring = Keyring(settings.secret_key, settings.secret_key_previous)
    app[ACCOUNTS] = AccountStore(client, app[LEDGER], keyring)
    app[SESSIONS] = SessionStore(client)
    yield


def setup(app: web.Application) -> None:
    """Register sign-in's routes and limits, the session layer and its stores."""
    settings = app[SETTINGS]
    limits = settings.limits
    # Sign-in fails closed: it sends mail and guards accounts.
    limit_routes(
        app,
        {
            "auth_code": RouteLimit((limits["code-ip"],), fail_open=False),
            "auth_verify": RouteLimit((limits["verify-ip"],), fail_open=False),
        },
    )
    with app[API].placed("sessions"):
        setup_sessions(app[API], secure=settings.https)
    setup_auth_routes(app[API])
    app.cleanup_ctx.extend([stores_ctx, session_cache_ctx, mailer_ctx])
