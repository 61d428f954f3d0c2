"""What a test may say about the service's log: no traceback, no warning from input."""

from __future__ import annotations

import logging

import pytest


def troubles(caplog: pytest.LogCaptureFixture) -> list[str]:
    """List the records at WARNING or above, or carrying a traceback."""
    return [
        f"{record.levelname} {record.name}: {record.getMessage()[:200]}"
        for record in caplog.records
        if record.levelno >= logging.WARNING or record.exc_info or record.exc_text
    ]


def crashes(caplog: pytest.LogCaptureFixture) -> list[str]:
    """List the records at ERROR or above, or carrying a traceback.

    For flows that warn by design (a replica behind, a notice not delivered).
    """
    return [
        f"{record.levelname} {record.name}: {record.getMessage()[:200]}"
        for record in caplog.records
        if record.levelno >= logging.ERROR or record.exc_info or record.exc_text
    ]
