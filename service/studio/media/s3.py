"""Media in an S3-compatible bucket, so app and workers on several machines share one.

obstore (Rust's object_store) carries the bytes: it was the fastest async
client measured here (1 MiB PUT 11.6 ms, GET 3.1 ms against aiobotocore's
17.7 and 6.2 ms, reference G §2), pins no other package, ships type stubs,
streams reads, and turns a large body into a multipart upload by itself.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Final

import obstore
from obstore.exceptions import (
    BaseError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from .faults import MediaRefused, MediaUnavailable, RangeNotSatisfiable
from .store import CHUNK_BYTES, CONTENT_TYPES, MissingMedia, export_key, valid_key

if TYPE_CHECKING:
    from obstore import Attributes, GetOptions, OffsetRange, SuffixRange
    from obstore.store import ClientConfig, RetryConfig, S3Config

    from ...settings import MediaS3Settings

# What the bucket (and a CDN reading it) tells browsers: keys never change.
MEDIA_CACHE: Final = "public, max-age=31536000, immutable"
# An account's export is private and fetched once, through this service.
EXPORT_CACHE: Final = "private, no-store"
# Parts of a multipart upload: obstore's 5 MiB default size, four at a time
# (at most ~20 MiB of one upload in memory; a 20 MiB clip takes 0.15 s here).
PART_BYTES: Final = 5 * 1024 * 1024
PARTS_AT_ONCE: Final = 4
# Reads served to a browser go out in pieces of this size.
SERVE_CHUNK: Final = 256 * 1024

# A failed connect or a 5xx is retried (with backoff) for at most this long.
_RETRY: RetryConfig = {"max_retries": 3, "retry_timeout": timedelta(seconds=20)}


@dataclass(frozen=True, slots=True)
class Reading:
    """One object (or a range of it) on its way from the bucket."""

    size: int  # of the whole object
    start: int  # first byte sent
    end: int  # one past the last byte sent
    partial: bool  # the range asked for (HTTP 206), not the whole object
    etag: str
    last_modified: datetime
    body: AsyncGenerator[bytes, None]  # empty for a HEAD


def attributes(key: str) -> Attributes:
    """Name the type and caching the bucket stores (and answers) with a key."""
    if export_key(key):
        return {"Content-Type": "application/zip", "Cache-Control": EXPORT_CACHE}
    return {
        "Content-Type": CONTENT_TYPES[key.rpartition(".")[2]],
        "Cache-Control": MEDIA_CACHE,
    }


def _checked(key: str) -> str:
    """Refuse anything but a key this service makes: no paths into the bucket."""
    if not (valid_key(key) or export_key(key)):
        raise ValueError("not a media key")
    return key


def _unavailable(error: BaseError) -> MediaUnavailable:
    """Keep the bucket's answer out of client replies; name only its kind."""
    if isinstance(error, PermissionDeniedError | UnauthenticatedError):
        return MediaRefused("the bucket refused the credentials")
    return MediaUnavailable(f"the bucket failed: {type(error).__name__}")


async def _pieces(chunks: AsyncIterator[bytes], size: int) -> AsyncIterator[bytes]:
    """Re-cut a stream into pieces of exactly `size` bytes, the last one shorter."""
    held = bytearray()
    async for chunk in chunks:
        held += chunk
        while len(held) >= size:
            yield bytes(held[:size])
            del held[:size]
    if held:
        yield bytes(held)


class S3MediaStore:
    """Media in a bucket; /media/{key} streams them, or a public URL points at them."""

    def __init__(self, config: MediaS3Settings, public_url: str = "") -> None:
        client: ClientConfig = {
            "connect_timeout": timedelta(seconds=5),
            # A stalled read fails (and is retried); a long video to a slow
            # client may take minutes, so the whole request gets longer.
            "read_timeout": timedelta(seconds=60),
            "timeout": timedelta(minutes=30),
            "allow_http": config.endpoint.startswith("http://"),
        }
        settings: S3Config = {
            "region": config.region,
            # A named endpoint (SeaweedFS, MinIO, R2…) is addressed path-style;
            # without one, AWS S3 itself in the region, virtual-hosted.
            "virtual_hosted_style_request": not config.endpoint,
        }
        if config.endpoint:
            settings["endpoint"] = config.endpoint
        if config.access_key_id:  # else the usual AWS sources (environment, role)
            settings["access_key_id"] = config.access_key_id
            settings["secret_access_key"] = config.secret_access_key
        self._store = S3Store(
            config.bucket, config=settings, client_options=client, retry_config=_RETRY
        )
        self.bucket = config.bucket
        self._base = public_url.rstrip("/") + "/" if public_url else "/media/"

    def __repr__(self) -> str:
        return f"S3MediaStore(bucket={self.bucket!r})"  # never the credentials

    async def check(self) -> None:
        """Ask the bucket about a key that is never there: proves the credentials."""
        try:
            await obstore.head_async(self._store, "studio-start-up-check")
        except FileNotFoundError:
            return
        except BaseError as error:
            raise _unavailable(error) from None

    async def put(self, key: str, data: bytes) -> None:
        """Upload the bytes (multipart past 5 MiB); the object appears whole or not."""
        await self._put(key, data)

    async def put_file(self, key: str, path: Path) -> None:
        """Upload a local file, read and sent a part at a time."""
        await self._put(key, path)

    async def _put(self, key: str, body: bytes | Path) -> None:
        try:
            await obstore.put_async(
                self._store,
                _checked(key),
                body,
                attributes=attributes(key),
                chunk_size=PART_BYTES,
                max_concurrency=PARTS_AT_ONCE,
            )
        except BaseError as error:
            raise _unavailable(error) from None

    async def get(self, key: str) -> bytes:
        """Return all bytes of a key; MissingMedia if it has none."""
        try:
            result = await obstore.get_async(self._store, _checked(key))
            return bytes(await result.bytes_async())
        except FileNotFoundError:
            raise MissingMedia(key) from None
        except BaseError as error:
            raise _unavailable(error) from None

    async def chunks(self, key: str, size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """Yield a key's bytes in pieces of at most `size`; MissingMedia if none."""
        try:
            result = await obstore.get_async(self._store, _checked(key))
        except FileNotFoundError:
            raise MissingMedia(key) from None
        except BaseError as error:
            raise _unavailable(error) from None
        try:
            async for piece in _pieces(result.stream(min_chunk_size=size), size):
                yield piece
        except BaseError as error:
            raise _unavailable(error) from None

    async def read(
        self,
        key: str,
        byte_range: OffsetRange | SuffixRange | tuple[int, int] | None = None,
        *,
        if_range: str | None = None,
        head: bool = False,
    ) -> Reading:
        """Open a key (or one range of it) for streaming, in one request.

        `byte_range` is obstore's: (start, end) with `end` exclusive, an
        offset to the end, or a suffix length. `if_range` drops the range
        when the object's ETag is not that one (RFC 9110 If-Range).
        """
        options: GetOptions = {"head": head}
        if byte_range is not None:
            options["range"] = byte_range
            if if_range:
                options["if_match"] = if_range
        try:
            result = await obstore.get_async(
                self._store, _checked(key), options=options
            )
        except FileNotFoundError:
            raise MissingMedia(key) from None
        except PreconditionError:  # If-Range did not match: the whole object
            return await self.read(key, head=head)
        except BaseError as error:
            if byte_range is not None:  # 416? obstore names it only in the text
                size = await self._size(key)
                if size is not None and _past_end(byte_range, size):
                    raise RangeNotSatisfiable(size) from None
            raise _unavailable(error) from None
        meta = result.meta
        start, end = result.range

        async def body() -> AsyncGenerator[bytes, None]:
            if head:
                return
            try:
                async for piece in _pieces(
                    result.stream(min_chunk_size=SERVE_CHUNK), SERVE_CHUNK
                ):
                    yield piece
            except BaseError as error:
                raise _unavailable(error) from None

        return Reading(
            size=meta["size"],
            start=start,
            end=end,
            partial=byte_range is not None,
            etag=meta["e_tag"] or "",
            last_modified=meta["last_modified"],
            body=body(),
        )

    async def _size(self, key: str) -> int | None:
        """Return an object's size, or None if it cannot be told."""
        with contextlib.suppress(BaseError, FileNotFoundError):
            return (await obstore.head_async(self._store, key))["size"]
        return None

    async def copy(self, key: str, new: str) -> None:
        """Copy the object inside the bucket (CopyObject: the bytes never come
        here), with its type and caching."""
        try:
            await obstore.copy_async(self._store, _checked(key), _checked(new))
        except FileNotFoundError:
            raise MissingMedia(key) from None
        except BaseError as error:
            raise _unavailable(error) from None

    async def delete(self, key: str) -> None:
        """Delete the object; a missing key is fine (S3 answers 204 either way)."""
        try:
            await obstore.delete_async(self._store, _checked(key))
        except FileNotFoundError:
            return
        except BaseError as error:
            raise _unavailable(error) from None

    def url(self, key: str) -> str:
        """Point at /media/ here (streamed from the bucket) or at the public URL."""
        return self._base + key

    async def signed_url(
        self, key: str, expires_in: timedelta = timedelta(hours=1)
    ) -> str:
        """Presign a GET: whoever holds the URL reads the key until it expires."""
        try:
            return await obstore.sign_async(
                self._store, "GET", _checked(key), expires_in
            )
        except BaseError as error:
            raise _unavailable(error) from None


def _past_end(
    byte_range: OffsetRange | SuffixRange | tuple[int, int], size: int
) -> bool:
    """Tell whether a range asks for nothing of an object of `size` bytes."""
    if isinstance(byte_range, tuple):
        return byte_range[0] >= size
    if "suffix" in byte_range:
        return size == 0
    return byte_range.get("offset", 0) >= size
