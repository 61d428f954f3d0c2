"""The daily free credits: once per Beijing day, atomic with the ledger."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
from redis.asyncio import Redis

from service.store.embedded import MailCatcher
from service.studio.daily import AlreadyClaimed, DailyCredits, next_day
from service.studio.ledger import iso

from .conftest import MakeClient
from .workbench import balance, ledger, sign_in


async def test_twenty_parallel_claims_grant_exactly_once(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """One 200 with the grant; nineteen 409 ALREADY_CLAIMED with next_at."""
    client = await studio()
    await sign_in(client, mail_server)
    answers = await asyncio.gather(
        *[client.post("/api/credits/daily") for _ in range(20)]
    )
    assert sorted(a.status for a in answers) == [200] + [409] * 19
    (won,) = [await a.json() for a in answers if a.status == 200]
    upcoming = iso(next_day(dt.datetime.now(dt.UTC)))
    assert won == {"granted": 10, "balance": 110, "next_at": upcoming}
    for answer in answers:
        if answer.status == 409:
            assert await answer.json() == {
                "error": "ALREADY_CLAIMED",
                "next_at": upcoming,
            }
    assert await balance(client) == 110
    grants = [e for e in await ledger(client) if e["kind"] == "grant"]
    assert [g["amount"] for g in grants] == [100, 10]


async def test_the_daily_lot_is_a_bonus_that_expires_seven_days_later(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """A `bonus` lot of credits.daily, spent before purchases, gone in 7 days."""
    client = await studio(STUDIO_CREDITS_DAILY="25")
    await sign_in(client, mail_server)
    before = dt.datetime.now(dt.UTC).replace(microsecond=0)
    body = await (await client.post("/api/credits/daily")).json()
    assert body["granted"] == 25
    lots = (await (await client.get("/api/credits")).json())["lots"]
    (daily,) = [lot for lot in lots if lot["kind"] == "bonus"]
    assert daily["granted"] == daily["remaining"] == 25
    expires = dt.datetime.fromisoformat(daily["expires_at"])
    assert dt.timedelta(days=7) <= expires - before <= dt.timedelta(days=7, seconds=5)


def test_a_day_turns_at_midnight_in_beijing() -> None:
    """15:59:59 UTC is still today in Beijing; 16:00 UTC is tomorrow."""
    late = dt.datetime(2026, 11, 27, 15, 59, 59, tzinfo=dt.UTC)
    assert next_day(late) == dt.datetime(2026, 11, 27, 16, 0, tzinfo=dt.UTC)
    turned = dt.datetime(2026, 11, 27, 16, 0, tzinfo=dt.UTC)
    assert next_day(turned) == dt.datetime(2026, 11, 28, 16, 0, tzinfo=dt.UTC)


async def test_a_new_beijing_day_grants_again_and_the_old_lot_expires(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Claims on other Beijing days grant again; a lot a week old leaves (`expire`)."""
    client = await studio()
    me = await sign_in(client, mail_server)
    daily = DailyCredits(redis, 10)
    start = dt.datetime.now(dt.UTC).replace(microsecond=0) - dt.timedelta(days=8)
    assert await daily.claim(me["id"], start) == 110
    later = start + dt.timedelta(days=5)
    assert await daily.claim(me["id"], later) == 120
    # Today's claim sweeps: the first lot (8 days old) has expired.
    body = await (await client.post("/api/credits/daily")).json()
    assert body["balance"] == 120
    kinds = [e["kind"] for e in await ledger(client)]
    assert kinds == ["grant", "grant", "grant", "expire", "grant"]


async def test_a_claim_dated_before_the_last_one_is_refused(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Two processes a second apart at Beijing midnight: one grant, not one each."""
    client = await studio()
    me = await sign_in(client, mail_server)
    daily = DailyCredits(redis, 10)
    midnight = dt.datetime(2026, 12, 10, 16, 0, tzinfo=dt.UTC)  # Beijing 12-11 00:00
    assert await daily.claim(me["id"], midnight) == 110
    for seconds in (-1, 1):  # the day before by a second, then the same day
        with pytest.raises(AlreadyClaimed):
            await daily.claim(me["id"], midnight + dt.timedelta(seconds=seconds))
    assert await daily.claim(me["id"], midnight + dt.timedelta(days=1)) == 120
