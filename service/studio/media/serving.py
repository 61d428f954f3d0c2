"""Serve stored media: immutable, ranged, never anything a browser would execute."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Final
from wsgiref.handlers import format_date_time

from aiohttp import hdrs, web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.web_request import BaseRequest

from ..keys import MEDIA
from .faults import MediaUnavailable, RangeNotSatisfiable
from .ranges import entity_tag_matches, requested_range
from .store import CONTENT_TYPES, DirectoryStore, MissingMedia, valid_key

if TYPE_CHECKING:
    from .s3 import S3MediaStore

IMMUTABLE: Final = "public, max-age=31536000, immutable"
_LOGGER: Final = logging.getLogger(__name__)


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


def _headers(key: str) -> dict[str, str]:
    """The headers of every media answer: its real type, cached for good, inert."""
    return {
        hdrs.CONTENT_TYPE: CONTENT_TYPES[key.rpartition(".")[2]],
        hdrs.CACHE_CONTROL: IMMUTABLE,
        "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": "default-src 'none'; sandbox",
        "Cross-Origin-Resource-Policy": "same-origin",
    }


def _not_found() -> web.HTTPNotFound:
    return web.HTTPNotFound(headers={"X-Content-Type-Options": "nosniff"})


async def media(request: web.Request) -> web.StreamResponse:
    """Answer a media key with its bytes (Range and If-None-Match included)."""
    key = request.match_info["key"]
    store = request.app[MEDIA]
    if not valid_key(key):
        raise _not_found()
    if not isinstance(store, DirectoryStore):
        # Already loaded wherever a bucket is the store (see chosen.py).
        from .s3 import S3MediaStore

        if isinstance(store, S3MediaStore):
            return await _from_bucket(request, store, key)
        raise _not_found()
    path = store.path(key)
    if not path.is_file():
        raise _not_found()
    return MediaResponse(path, headers=_headers(key))


async def _from_bucket(
    request: web.Request, store: S3MediaStore, key: str
) -> web.StreamResponse:
    """Stream a key from the bucket: same origin, same headers as from a directory.

    Proxied rather than redirected: the pages' CSP allows media from this
    origin (and the public URL) only, /media/ keeps its nosniff, sandbox and
    same-origin headers, and stored media_urls never expire. A CDN in front
    (media.public_url) takes the bytes off this service.
    """
    head = request.method == hdrs.METH_HEAD
    headers = _headers(key)
    try:
        if_none_match = request.headers.get(hdrs.IF_NONE_MATCH)
        if if_none_match is not None:  # rare: immutable media are not revalidated
            probe = await store.read(key, head=True)
            if entity_tag_matches(if_none_match, probe.etag):
                headers[hdrs.ETAG] = probe.etag
                return web.Response(status=304, headers=headers)
        if_range = request.headers.get(hdrs.IF_RANGE)
        byte_range = None if head else requested_range(request.headers.get(hdrs.RANGE))
        if byte_range is not None and if_range and not if_range.startswith('"'):
            byte_range = None  # a date (or a weak tag): the whole object is safe
        reading = await store.read(key, byte_range, if_range=if_range, head=head)
    except MissingMedia:
        raise _not_found() from None
    except RangeNotSatisfiable as error:
        headers[hdrs.CONTENT_RANGE] = f"bytes */{error.size}"
        raise web.HTTPRequestRangeNotSatisfiable(headers=headers) from None
    except MediaUnavailable as error:
        _LOGGER.warning("media %s: %s", key, error)
        raise web.HTTPServiceUnavailable(
            headers={
                hdrs.RETRY_AFTER: "1",
                hdrs.CACHE_CONTROL: "no-store",
                "X-Content-Type-Options": "nosniff",
            }
        ) from None
    headers |= {
        hdrs.ETAG: reading.etag,
        hdrs.LAST_MODIFIED: format_date_time(reading.last_modified.timestamp()),
        hdrs.ACCEPT_RANGES: "bytes",
    }
    response = web.StreamResponse(status=206 if reading.partial else 200)
    response.headers.update(headers)
    if reading.partial:
        response.headers[hdrs.CONTENT_RANGE] = (
            f"bytes {reading.start}-{reading.end - 1}/{reading.size}"
        )
    response.content_length = reading.end - reading.start
    try:
        await response.prepare(request)
        async for piece in reading.body:
            await response.write(piece)
        await response.write_eof()
    except MediaUnavailable as error:  # mid-body: cut it short, the client retries
        _LOGGER.warning("media %s: %s after %s", key, error, reading.start)
        response.force_close()
    except ConnectionResetError:
        pass  # the client went away
    finally:
        await reading.body.aclose()
    return response


def setup_media_routes(app: web.Application) -> None:
    """Register /media/{key} outside /api: no session, no limits, no JSON."""
    app.router.add_get("/media/{key}", media, name="media")
