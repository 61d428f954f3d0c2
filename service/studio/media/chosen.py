"""The media store the settings name: the bucket if one is set, else the directory."""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Final

from ...settings import MediaS3Settings, SettingsError, WorkbenchSettings, variable
from .faults import MediaRefused, MediaUnavailable
from .store import DirectoryStore, MediaStore

if TYPE_CHECKING:
    from .s3 import S3MediaStore

_LOGGER: Final = logging.getLogger(__name__)
# How long start-up waits to hear from the bucket before going on without.
CHECK_SECONDS: Final = 5.0


def media_store(settings: WorkbenchSettings) -> MediaStore:
    """Build the store app and workers share; no I/O yet."""
    if settings.media_s3 is None:
        return DirectoryStore(settings.media_dir, settings.media_public_url)
    return _bucket(settings.media_s3, settings.media_public_url)


def _usable_directory(root: Path) -> None:
    """Make the media directory, and prove a file can be written in it."""
    if root.exists() and not root.is_dir():
        raise SettingsError(f"{variable('media.dir')}: {root} is not a directory")
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=root, prefix=".probe-"):
            pass
    except OSError as err:
        raise SettingsError(
            f"{variable('media.dir')}: cannot keep media in {root}:"
            f" {err.strerror or err}"
        ) from None


def _bucket(s3: MediaS3Settings, public_url: str) -> S3MediaStore:
    """Build the bucket's store: obstore is loaded only where a bucket is set."""
    from .s3 import S3MediaStore

    return S3MediaStore(s3, public_url)


async def opened_media_store(settings: WorkbenchSettings) -> MediaStore:
    """Build the store and prove a bucket takes our credentials, before serving.

    A bucket that refuses them stops the start with a configuration error; one
    that cannot be reached yet is only logged, as it may come up later.
    """
    if settings.media_s3 is None:
        _usable_directory(settings.media_dir)
        return media_store(settings)
    store = _bucket(settings.media_s3, settings.media_public_url)
    try:
        await asyncio.wait_for(store.check(), CHECK_SECONDS)
    except MediaRefused:
        raise SettingsError(
            f"{variable('media.s3_access_key_id')},"
            f" {variable('media.s3_secret_access_key')}: the bucket"
            f" {store.bucket!r} refused them"
        ) from None
    except (MediaUnavailable, TimeoutError) as error:
        _LOGGER.warning("media bucket %s: %s", store.bucket, error or "no answer")
    return store
