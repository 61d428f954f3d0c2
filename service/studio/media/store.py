"""Where media bytes live: behind one interface, so a bucket can replace the disk."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import BinaryIO, Final, Protocol

# 16 random bytes: 128 bits, URL-safe; the extension fixes the served type.
_KEY: Final = re.compile(r"^[A-Za-z0-9_-]{22}\.(png|jpg|webp|mp4)$")
CONTENT_TYPES: Final = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "mp4": "video/mp4",
}
# An account's export: 24 random bytes (192 bits), never served at /media/.
_EXPORT_KEY: Final = re.compile(r"^exports/[A-Za-z0-9_-]{32}\.zip$")
# The most a reader holds of one file at a time.
CHUNK_BYTES: Final = 1024 * 1024


class MissingMedia(LookupError):
    """No bytes are stored under the key."""


def new_key(extension: str) -> str:
    """Draw an unguessable media key with its extension."""
    if extension not in CONTENT_TYPES:
        raise ValueError(f"no media type for .{extension}")
    return f"{secrets.token_urlsafe(16)}.{extension}"


def valid_key(key: str) -> bool:
    """Tell whether a string is a media key this service could have made."""
    return _KEY.fullmatch(key) is not None


def new_export_key() -> str:
    """Draw an unguessable key for an account's export ZIP."""
    return f"exports/{secrets.token_urlsafe(24)}.zip"


def export_key(key: str) -> bool:
    """Tell whether a string is an export's key (refused by the public /media/)."""
    return _EXPORT_KEY.fullmatch(key) is not None


class MediaStore(Protocol):
    """Store, delete and locate media; the directory and a bucket both fit."""

    async def put(self, key: str, data: bytes) -> None:
        """Store the bytes under the key (whole or not at all)."""

    async def put_file(self, key: str, path: Path) -> None:
        """Store a local file's bytes under the key, streamed, whole or not at all."""

    def chunks(self, key: str, size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """Yield a key's bytes in pieces of at most `size`; MissingMedia if none."""

    async def copy(self, key: str, new: str) -> None:
        """Store a key's bytes again under another key; MissingMedia if none."""

    async def delete(self, key: str) -> None:
        """Remove the bytes; a missing key is fine."""

    def url(self, key: str) -> str:
        """Return where a client fetches the bytes."""


class DirectoryStore:
    """Media in a local directory, served at /media/{key} by this service."""

    def __init__(self, root: Path, public_url: str = "") -> None:
        self.root = root
        self._base = public_url.rstrip("/") + "/media/" if public_url else "/media/"

    def path(self, key: str) -> Path:
        """Return the file of a key, two levels deep to keep directories small."""
        if export_key(key):
            return self.root / key
        if not valid_key(key):
            raise ValueError("not a media key")
        return self.root / key[:2] / key

    def _write(self, key: str, fill: BinaryIO | bytes) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as file:
                if isinstance(fill, bytes):
                    file.write(fill)
                else:
                    shutil.copyfileobj(fill, file, CHUNK_BYTES)
            os.replace(temporary, target)  # readers see all of it or nothing
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    def _copy(self, key: str, path: Path) -> None:
        with path.open("rb") as source:
            self._write(key, source)

    def _duplicate(self, key: str, new: str) -> None:
        try:
            self._copy(new, self.path(key))
        except FileNotFoundError:
            raise MissingMedia(key) from None

    async def put(self, key: str, data: bytes) -> None:
        """Write in a thread, then rename into place."""
        await asyncio.get_running_loop().run_in_executor(None, self._write, key, data)

    async def put_file(self, key: str, path: Path) -> None:
        """Copy the file in a thread, a chunk at a time, then rename into place."""
        await asyncio.get_running_loop().run_in_executor(None, self._copy, key, path)

    async def copy(self, key: str, new: str) -> None:
        """Copy the file in a thread, then rename the copy into place."""
        await asyncio.get_running_loop().run_in_executor(
            None, self._duplicate, key, new
        )

    async def chunks(self, key: str, size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
        """Read the file in a thread, one piece of at most `size` at a time."""
        loop = asyncio.get_running_loop()
        try:
            file = await loop.run_in_executor(None, self.path(key).open, "rb")
        except FileNotFoundError:
            raise MissingMedia(key) from None
        try:
            while chunk := await loop.run_in_executor(None, file.read, size):
                yield chunk
        finally:
            file.close()  # a read file closes at once; an aclose() may not wait

    async def delete(self, key: str) -> None:
        """Unlink the file if it is there."""
        self.path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        """Point at this service's /media/ route, or at the public URL's."""
        return self._base + key
