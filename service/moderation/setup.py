"""Content safety's resources and routes: the word list, its watcher, the log."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from aiohttp import web

from ..content import CONTENT_DIR
from ..keys import CLOCK, REDIS, SETTINGS
from ..settings import Settings
from .log import ModerationLog
from .prompts import MODERATION, Moderation
from .wordlist import WatchedList, list_path


def moderation_for(settings: Settings, log: ModerationLog) -> Moderation:
    """Read the list the settings name (the operator's content, or the packaged one)."""
    path = list_path(settings.content_dir or CONTENT_DIR)
    return Moderation(words=WatchedList(path), log=log)


async def moderation_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the automaton once, then rebuild it whenever the file changes."""
    settings = app[SETTINGS]
    options = settings.workbench.moderation
    log = ModerationLog(app[REDIS], options.log_days, app[CLOCK])
    moderation = app[MODERATION] = moderation_for(settings, log)
    watcher = asyncio.create_task(
        moderation.words.watch(options.reload_seconds), name="moderation-list"
    )
    yield
    watcher.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await watcher


def setup(app: web.Application) -> None:
    """Register content safety's resources."""
    app.cleanup_ctx.append(moderation_ctx)
