"""My account: the export of my data and the deletion of my account."""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from ..api.boundary import API
from ..auth.keys import RETURNING
from ..keys import SETTINGS
from ..limits.http import RouteLimit
from ..limits.setup import limit_routes, report_limits
from .deletion_routes import deletions_ctx, setup_deletion_routes
from .export_routes import EXPORT_LIMITED, exports_ctx, setup_export_routes
from .keys import DELETIONS


async def returning_ctx(app: web.Application) -> AsyncIterator[None]:
    """Let sign-in restore an account that is being deleted."""
    app[RETURNING] = app[DELETIONS]
    yield


def setup(app: web.Application) -> None:
    """Register the export and deletion routes, their limits and their workers."""
    limits = app[SETTINGS].limits
    # A deletion spends a code like verify does, from the same bucket.
    limit_routes(
        app, {"account_delete": RouteLimit((limits["verify-ip"],), fail_open=False)}
    )
    report_limits(app, EXPORT_LIMITED)
    setup_deletion_routes(app[API])
    setup_export_routes(app[API])
    app.cleanup_ctx.extend([deletions_ctx, returning_ctx, exports_ctx])
