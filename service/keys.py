"""The application keys every concern shares: settings, content, clock, Redis.

Each concern owns the keys of what it stores, in its own package
(`service/auth/keys.py`, `service/studio/keys.py`, ...); only what all of them
read lives here, below all of them.
"""

from __future__ import annotations

from typing import Final

from aiohttp import web
from redis.asyncio import Redis

from .clock import Clock
from .content import Content
from .settings import Settings

SETTINGS: Final = web.AppKey("settings", Settings)
CONTENT: Final = web.AppKey("content", Content)
REDIS: Final = web.AppKey("redis", Redis)
# What time it is (tests move an app to another day); see service/clock.py.
CLOCK: Final = web.AppKey[Clock]("clock")
