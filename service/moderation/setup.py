"""Content safety's resources and routes: the word list, the log, reports."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Final

from aiohttp import web

from ..api.boundary import API
from ..content import CONTENT_DIR
from ..keys import CLOCK, REDIS, SETTINGS
from ..limits.http import RouteLimit
from ..limits.setup import limit_routes
from ..settings import Settings
from .log import ModerationLog
from .prompts import MODERATION, Moderation
from .providers.chosen import fetch_warning, provider_for
from .reports import REPORTS, ReportStore, report_square_work, report_status
from .wordlist import WatchedList, list_path

_LOGGER: Final = logging.getLogger(__name__)


def watched_list(settings: Settings) -> WatchedList:
    """Read the list the settings name (the operator's content, or the packaged one).

    A file that is not UTF-8 raises WordListError, a ContentError: start-up
    stops with one line naming it.
    """
    return WatchedList(list_path(settings.content_dir or CONTENT_DIR))


def moderation_for(
    settings: Settings, log: ModerationLog, words: WatchedList | None = None
) -> Moderation:
    """Put the list, the log and the configured provider together."""
    options = settings.workbench.moderation
    return Moderation(
        words=words or watched_list(settings),
        log=log,
        provider=provider_for(options),
        timeout=options.timeout,
    )


def moderation_ctx(
    words: WatchedList,
) -> Callable[[web.Application], AsyncIterator[None]]:
    """Open the log on the app's Redis; rebuild the list whenever the file changes."""

    async def opened(app: web.Application) -> AsyncIterator[None]:
        options = app[SETTINGS].workbench.moderation
        if (warning := fetch_warning(app[SETTINGS])) is not None:
            _LOGGER.warning("%s", warning)
        log = ModerationLog(app[REDIS], options.log_days, app[CLOCK])
        app[MODERATION] = moderation_for(app[SETTINGS], log, words)
        app[REPORTS] = ReportStore(app[REDIS], log)
        watcher = asyncio.create_task(
            words.watch(options.reload_seconds), name="moderation-list"
        )
        yield
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher

    return opened


def setup(app: web.Application) -> None:
    """Register content safety's resources and the report routes, limited per IP."""
    gallery = app[SETTINGS].limits["gallery"]  # as the square is browsed
    limited = RouteLimit((gallery,), fail_open=False)
    limit_routes(app, {"square_report": limited, "report_status": limited})
    app[API].add_routes(
        [
            web.post(
                "/square/{work_id}/report", report_square_work, name="square_report"
            ),
            web.get("/reports/{report_id}", report_status, name="report_status"),
        ]
    )
    # Built here, in create_app: a list that cannot be read stops start-up.
    app.cleanup_ctx.append(moderation_ctx(watched_list(app[SETTINGS])))
