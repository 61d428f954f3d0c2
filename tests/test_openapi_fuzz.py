"""Schemathesis, all checks, against a live `serve`: once per representation."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from service.store.embedded import RedisServer

from .conftest import TEST_SECRET
from .processes import running


@pytest.mark.parametrize("accept", [None, "text/markdown"])
def test_schemathesis_finds_nothing(
    redis_server: RedisServer, tmp_path: Path, accept: str | None
) -> None:
    """`st run --checks all` exits 0 with the default Accept and with Markdown."""
    variables = {"STUDIO_REDIS_URL": redis_server.url, "STUDIO_SECRET_KEY": TEST_SECRET}
    with running("serve", variables) as (base_url, _):
        command = [
            str(Path(sys.executable).with_name("st")), "run",
            f"{base_url}/openapi.json",
            # Without an explicit filter schemathesis skips the schema's own URL.
            "--include-path-regex", ".*",
            "--checks", "all", "--max-examples", "25", "--seed", "1",
            "--request-timeout", "5", "--wait-for-schema", "10",
            "--report", "junit", "--report-dir", str(tmp_path),
        ]  # fmt: skip
        if accept:
            command += ["-H", f"Accept: {accept}"]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=300, cwd=tmp_path
        )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "13 selected / 13 total" in result.stdout
    assert "No issues found" in result.stdout
