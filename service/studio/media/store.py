"""Where media bytes live: behind one interface, so a bucket can replace the disk."""

from __future__ import annotations

import asyncio
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Final, Protocol

# 16 random bytes: 128 bits, URL-safe; the extension fixes the served type.
_KEY: Final = re.compile(r"^[A-Za-z0-9_-]{22}\.(png|jpg|webp|mp4)$")
CONTENT_TYPES: Final = {
    "png": "image/png",
    "jpg": "image/jpeg",
    "webp": "image/webp",
    "mp4": "video/mp4",
}


def new_key(extension: str) -> str:
    """Draw an unguessable media key with its extension."""
    if extension not in CONTENT_TYPES:
        raise ValueError(f"no media type for .{extension}")
    return f"{secrets.token_urlsafe(16)}.{extension}"


def valid_key(key: str) -> bool:
    """Tell whether a string is a media key this service could have made."""
    return _KEY.fullmatch(key) is not None


class MediaStore(Protocol):
    """Store, delete and locate media; the directory and a bucket both fit."""

    async def put(self, key: str, data: bytes) -> None:
        """Store the bytes under the key (whole or not at all)."""

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
        if not valid_key(key):
            raise ValueError("not a media key")
        return self.root / key[:2] / key

    def _write(self, key: str, data: bytes) -> None:
        target = self.path(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(temporary, target)  # readers see all of it or nothing
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise

    async def put(self, key: str, data: bytes) -> None:
        """Write in a thread, then rename into place."""
        await asyncio.get_running_loop().run_in_executor(None, self._write, key, data)

    async def delete(self, key: str) -> None:
        """Unlink the file if it is there."""
        self.path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        """Point at this service's /media/ route, or at the public URL's."""
        return self._base + key
