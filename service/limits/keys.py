"""The limiter's keys: its client, and what its layers leave on a request."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from .limiter import Decision, Limiter

LIMITER: Final = web.AppKey("limiter", Limiter)
CLIENT: Final = web.RequestKey("client", str)
# Redis already failed this request (the limiter fell back): do not wait on it again.
DEGRADED: Final = web.RequestKey("degraded", bool)
DECISIONS: Final = web.RequestKey("decisions", list[Decision])
# A value the limiter read for the handler in its own round trip (None: not read).
READ_ALONG: Final = web.RequestKey["bytes | None"]("read_along")
