"""Content safety's resources and routes: the word list, the log, reports."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from ..api.boundary import API
from ..content import CONTENT_DIR
from ..keys import CLOCK, REDIS, SETTINGS
from ..limits.http import RouteLimit
from ..limits.setup import limit_routes
from ..settings import Settings
from .log import ModerationLog
from .prompts import MODERATION, Moderation
from .providers.chosen import provider_for
from .reports import REPORTS, ReportStore, report_square_work
from .wordlist import WatchedList, list_path


def moderation_for(settings: Settings, log: ModerationLog) -> Moderation:
    """Read the list the settings name (the operator's content, or the packaged one)."""
    path = list_path(settings.content_dir or CONTENT_DIR)
    options = settings.workbench.moderation
    return Moderation(
        words=WatchedList(path),
        log=log,
        provider=provider_for(options),
        timeout=options.timeout,
    )


async def moderation_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the automaton once, then rebuild it whenever the file changes."""
    settings = app[SETTINGS]
    options = settings.workbench.moderation
    log = ModerationLog(app[REDIS], options.log_days, app[CLOCK])
    moderation = app[MODERATION] = moderation_for(settings, log)
    app[REPORTS] = ReportStore(app[REDIS], log)
    watcher = asyncio.create_task(
        moderation.words.watch(options.reload_seconds), name="moderation-list"
    )
    yield
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


def setup(app: web.Application) -> None:
    """Register content safety's resources and the report route, limited per IP."""
    gallery = app[SETTINGS].limits["gallery"]  # as the square is browsed
    limit_routes(app, {"square_report": RouteLimit((gallery,), fail_open=False)})
    app[API].add_routes(
        [web.post("/square/{work_id}/report", report_square_work, name="square_report")]
    )
    app.cleanup_ctx.append(moderation_ctx)
