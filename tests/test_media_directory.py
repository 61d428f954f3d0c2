"""The media directory is proved usable at start-up, as a bucket's credentials are."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from service.studio.media.store import DirectoryStore, MissingMedia, new_key

from .conftest import TEST_SECRET
from .processes import studio_environ


@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_a_media_directory_that_cannot_keep_files_stops_the_start(
    tmp_path: Path, command: str, under: bool
) -> None:
    """Exit 2 and one line naming STUDIO_MEDIA_DIR, before anything is served."""
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a directory")
    media = blocker / "media" if under else blocker
    result = subprocess.run(
        [sys.executable, "-m", "service", command],
        cwd=tmp_path,
        env=studio_environ(
            STUDIO_MEDIA_DIR=str(media),
            STUDIO_REDIS_URL="redis://127.0.0.1:1/0",
            STUDIO_SECRET_KEY=TEST_SECRET,
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("studio: configuration error: STUDIO_MEDIA_DIR: "), line
    assert str(media) in line


async def test_a_copy_holds_the_same_bytes_and_a_missing_key_is_missing(
    tmp_path: Path,
) -> None:
    """copy (the takedown's move) writes whole or not at all, beside the original."""
    store = DirectoryStore(tmp_path / "media")
    key, new = new_key("png"), new_key("png")
    await store.put(key, b"\x89PNG bytes")
    await store.copy(key, new)
    assert [piece async for piece in store.chunks(new)] == [b"\x89PNG bytes"]
    assert [piece async for piece in store.chunks(key)] == [b"\x89PNG bytes"]
    with pytest.raises(MissingMedia):
        await store.copy(new_key("png"), new_key("png"))
    names = await asyncio.to_thread(
        lambda: sorted(p.name for p in (tmp_path / "media").rglob("*") if p.is_file())
    )
    assert names == sorted([key, new])  # no temporary file left behind
