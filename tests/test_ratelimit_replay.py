"""A denial answered again from memory reports the buckets as they are now."""

from __future__ import annotations

import asyncio

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.limits.limiter import MICROS, Decision, Limiter, Policy
from service.store.embedded import RedisServer

from .conftest import SettingsFactory
from .test_ratelimit_http import _limits, _parsed
from .workbench import new_address

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = pytest.mark.timing

# A cooldown of 2 s beside a bucket of 3 that refills every 0.1 s.
COOL = Policy("cool", 1, 2, 1)
QUICK = Policy("quick", 13, 1, 3)
# A bucket of 3 that refills once an hour.
SLOW = Policy("slow", 4, 3600, 3)


def _state(decision: Decision, name: str) -> tuple[int, str]:
    (state,) = [s for s in decision.states if s.policy.name == name]
    return state.remaining, state.header()


async def test_a_repeated_multi_policy_denial_shows_the_refilled_bucket(
    redis: Redis, redis_server: RedisServer
) -> None:
    """The bucket that did not deny refills meanwhile: its r is the current one."""
    limiter = Limiter.from_url(redis_server.url)
    try:
        assert (await limiter.check("test:refill", [COOL, QUICK])).allowed
        first = await limiter.check("test:refill", [COOL, QUICK])
        assert not first.allowed
        assert _state(first, "quick")[0] == 2
        await asyncio.sleep(0.35)  # QUICK is full again; COOL still denies
        again = await limiter.check("test:refill", [COOL, QUICK])
        assert not again.allowed
        assert _state(again, "quick") == (3, '"quick";r=3')
        assert again.worst_retry_us < first.worst_retry_us
    finally:
        await limiter.aclose()


async def test_a_repeated_multi_policy_denial_sees_what_other_processes_spent(
    redis: Redis, redis_server: RedisServer
) -> None:
    """Another process spends the bucket that did not deny: the replay shows r=0."""
    here, there = Limiter.from_url(redis_server.url), Limiter.from_url(redis_server.url)
    try:
        assert (await here.check("test:shared", [COOL, SLOW])).allowed
        assert not (await here.check("test:shared", [COOL, SLOW])).allowed
        # The same subject's SLOW bucket, charged alone elsewhere, empties.
        assert (await there.check("test:shared", [SLOW])).allowed
        assert (await there.check("test:shared", [SLOW])).allowed
        again = await here.check("test:shared", [COOL, SLOW])
        assert not again.allowed
        remaining, header = _state(again, "slow")
        assert remaining == 0
        seconds = int(header.rpartition("t=")[2])
        assert 3590 <= seconds <= 3600  # the next token, not the stale r=2;t=0
    finally:
        await here.aclose()
        await there.aclose()


async def test_a_single_policy_denial_replayed_from_memory_counts_down(
    redis: Redis, redis_server: RedisServer
) -> None:
    """From memory, t never runs behind the true wait: it falls with the clock."""
    limiter = Limiter.from_url(redis_server.url)
    try:
        assert (await limiter.check("test:alone", [COOL])).allowed
        first = await limiter.check("test:alone", [COOL])
        await asyncio.sleep(1.05)
        again = await limiter.check("test:alone", [COOL])
        assert _state(first, "cool") == (0, '"cool";r=0;t=2')
        assert _state(again, "cool") == (0, '"cool";r=0;t=1')
        assert again.worst_retry_us <= first.worst_retry_us - 1.05 * MICROS
    finally:
        await limiter.aclose()


async def test_a_repeated_address_cooldown_answers_with_current_headers(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Over HTTP: the hour bucket shown on the second 429 is the refilled one."""
    settings = make_settings(
        **_limits("code_cooldown", 1, 3, 1), **_limits("code_email_hour", 13, 1, 3)
    )
    client = await aiohttp_client(create_app(settings))
    email = new_address()
    assert (await client.post("/api/auth/code", json={"email": email})).status == 200
    first = await client.post("/api/auth/code", json={"email": email})
    assert first.status == 429
    assert _parsed(first)[1]["code-email-hour"]["r"] == 2
    await asyncio.sleep(0.35)
    again = await client.post("/api/auth/code", json={"email": email})
    assert again.status == 429
    _, states = _parsed(again)
    assert states["code-email-hour"] == {"r": 3}
    cooldown = states["code-cooldown"]
    assert cooldown["r"] == 0
    assert cooldown["t"] == int(again.headers["Retry-After"]) <= 3
