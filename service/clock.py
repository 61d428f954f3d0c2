"""One source of the current UTC time, so a test can move a whole app to another day."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

Clock = Callable[[], dt.datetime]


def utc_now() -> dt.datetime:
    """Return the current time, aware, in UTC."""
    return dt.datetime.now(dt.UTC)


def midnight(day: dt.date) -> dt.datetime:
    """Return the instant a UTC day begins."""
    return dt.datetime.combine(day, dt.time(), dt.UTC)
