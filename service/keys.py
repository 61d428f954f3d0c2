"""Every typed application key, in one place."""

from __future__ import annotations

from typing import Final

from aiohttp import web
from redis.asyncio import Redis

from .content import Content
from .settings import Settings

SETTINGS: Final = web.AppKey("settings", Settings)
CONTENT: Final = web.AppKey("content", Content)
REDIS: Final = web.AppKey("redis", Redis)
