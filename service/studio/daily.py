"""The daily free credits: once per account per calendar day in Beijing (UTC+8)."""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web
from redis.asyncio import Redis

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response
from ..auth.sessions import SESSION
from ..keys import REDIS, SETTINGS
from ..store.durable import DurableScripts
from .ledger import account_key, iso, now, script, text

BEIJING: Final = dt.timezone(dt.timedelta(hours=8))
# A daily lot expires this long after it is granted.
LIFETIME: Final = dt.timedelta(days=7)


class AlreadyClaimed(Exception):
    """Today's credits (Beijing time) were granted already."""


def next_day(moment: dt.datetime) -> dt.datetime:
    """The next midnight in Beijing after a moment, in UTC."""
    local = moment.astimezone(BEIJING)
    midnight = dt.datetime.combine(
        local.date() + dt.timedelta(days=1), dt.time(), BEIJING
    )
    return midnight.astimezone(dt.UTC)


class DailyCredits:
    """Grant each account its daily lot once per Beijing day, atomically."""

    def __init__(self, redis: Redis, amount: int, wait_replicas: int = 0) -> None:
        self._durable = DurableScripts(redis, wait_replicas)
        self._script = script(redis, "daily")
        self.amount = amount

    async def claim(self, account_id: str, moment: dt.datetime) -> int:
        """Grant today's lot; the new balance, or AlreadyClaimed."""
        expires = moment + LIFETIME
        args: list[str | int] = [
            moment.astimezone(BEIJING).date().isoformat(), self.amount,
            int(moment.timestamp()), iso(moment),
            int(expires.timestamp()), iso(expires),
        ]  # fmt: skip
        reply = await self._durable.run(self._script, [account_key(account_id)], args)
        if text(reply[0]) != "OK":  # NO_ACCOUNT cannot hold a session
            raise AlreadyClaimed
        return int(reply[1])


DAILY: Final = web.AppKey("daily", DailyCredits)


async def claim(request: web.Request) -> web.StreamResponse:
    """Grant me today's credits, once per day in Beijing."""
    moment = now()
    upcoming = iso(next_day(moment))
    daily = request.app[DAILY]
    try:
        balance = await daily.claim(request[SESSION].account_id, moment)
    except AlreadyClaimed:
        raise ApiError(409, "ALREADY_CLAIMED", next_at=upcoming) from None
    return json_response(
        {"granted": daily.amount, "balance": balance, "next_at": upcoming}
    )


async def daily_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the daily grant on the app's Redis."""
    settings = app[SETTINGS]
    app[DAILY] = DailyCredits(
        app[REDIS], settings.workbench.daily_credits, settings.redis_wait_replicas
    )
    yield


def setup_daily_routes(app: web.Application, api: ApiBoundary) -> None:
    """Register POST /api/credits/daily and its grant."""
    api.add_routes([web.post("/credits/daily", claim, name="credits_daily")])
    app.cleanup_ctx.append(daily_ctx)
