"""Serve stored media: immutable, ranged, never anything a browser would execute."""

from __future__ import annotations

import asyncio
from typing import Final

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from ...keys import MEDIA
from .store import CONTENT_TYPES, DirectoryStore, valid_key

IMMUTABLE: Final = "public, max-age=31536000, immutable"


class MediaResponse(web.FileResponse):
    """A FileResponse whose file is closed even when the client goes away.

    aiohttp opens the file in a thread; a request cancelled meanwhile (a
    browser dropping an image it no longer shows) would leave it open until
    the collector finds it. Shielded, the send runs to its end (or its error
    on the closed socket) and closes the file itself.
    """

    async def prepare(self, request: BaseRequest) -> AbstractStreamWriter | None:
        """Send the file; a cancelled request does not interrupt the send."""
        return await asyncio.shield(super().prepare(request))


async def media(request: web.Request) -> web.StreamResponse:
    """Answer a media key with its bytes (Range and If-None-Match included)."""
    key = request.match_info["key"]
    store = request.app[MEDIA]
    if not (valid_key(key) and isinstance(store, DirectoryStore)):
        raise web.HTTPNotFound(headers={"X-Content-Type-Options": "nosniff"})
    path = store.path(key)
    if not path.is_file():
        raise web.HTTPNotFound(headers={"X-Content-Type-Options": "nosniff"})
    return MediaResponse(
        path,
        headers={
            hdrs.CONTENT_TYPE: CONTENT_TYPES[key.rpartition(".")[2]],
            hdrs.CACHE_CONTROL: IMMUTABLE,
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "default-src 'none'; sandbox",
            "Cross-Origin-Resource-Policy": "same-origin",
        },
    )


def setup_media_routes(app: web.Application) -> None:
    """Register /media/{key} outside /api: no session, no limits, no JSON."""
    app.router.add_get("/media/{key}", media, name="media")
