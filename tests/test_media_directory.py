"""The media directory is proved usable at start-up, as a bucket's credentials are."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
