"""Rate limits over HTTP: headers, exactness, the client's address, shared budgets."""

from __future__ import annotations

import asyncio
import urllib.error
import urllib.request
import uuid
from typing import Any

import http_sf
import pytest
import redis as sync_redis
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import RedisServer

from .conftest import TEST_SECRET, Client, SettingsFactory
from .processes import running


def _limits(name: str, quota: int, window: int, burst: int) -> dict[str, str]:
    prefix = f"STUDIO_LIMITS_{name.upper()}_"
    return {
        prefix + "QUOTA": str(quota),
        prefix + "WINDOW": str(window),
        prefix + "BURST": str(burst),
    }


async def _limited(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, **variables: str
) -> Client:
    return await aiohttp_client(create_app(make_settings(**variables)))


def _parsed(
    response: Any,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    policy = http_sf.parse(response.headers["RateLimit-Policy"].encode(), tltype="list")
    state = http_sf.parse(response.headers["RateLimit"].encode(), tltype="list")
    return dict(policy), dict(state)  # type: ignore[arg-type]


async def test_the_square_allows_its_burst_then_answers_a_parseable_429(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Burst of 200s, then 429 with problem+json, Retry-After and draft-10 headers."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("gallery", 10, 60, 5)
    )
    for remaining in range(4, -1, -1):
        response = await client.get("/api/square")
        assert response.status == 200
        policies, states = _parsed(response)
        assert policies == {"gallery": {"q": 10, "w": 60}}
        assert states["gallery"]["r"] == remaining
    denied = await client.get("/api/square")
    assert denied.status == 429
    assert denied.headers["Content-Type"] == "application/problem+json"
    assert denied.headers["Cache-Control"] == "no-store"
    retry_after = int(denied.headers["Retry-After"])
    assert 1 <= retry_after <= 12
    _, states = _parsed(denied)
    assert states["gallery"] == {"r": 0, "t": retry_after}
    body = await denied.json()
    assert body["error"] == "RATE_LIMITED"
    assert body["retry_after"] == retry_after
    assert body["status"] == 429
    assert body["violated-policies"] == ["gallery"]
    assert body["type"].endswith("#quota-exceeded")


async def test_retry_after_is_never_early(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Waiting exactly Retry-After seconds is always enough."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("gallery", 2, 1, 1)
    )
    assert (await client.get("/api/square")).status == 200
    denied = await client.get("/api/square")
    assert denied.status == 429
    await asyncio.sleep(int(denied.headers["Retry-After"]))
    assert (await client.get("/api/square")).status == 200


async def test_500_concurrent_requests_get_exactly_the_burst(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Exact under concurrency: 100 of 500 pass."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("gallery", 200, 3600, 100)
    )
    responses = await asyncio.gather(*(client.get("/api/square") for _ in range(500)))
    statuses = [r.status for r in responses]
    assert statuses.count(200) == 100
    assert statuses.count(429) == 400


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def test_two_processes_sharing_redis_share_one_budget(
    redis_server: RedisServer,
) -> None:
    """Two `serve` processes, one Redis: the burst is spent once, not twice."""
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        # T = 1 h: no token comes back however slowly a busy machine runs the test.
        **_limits("gallery", 8, 3600, 7),
    }
    with sync_redis.Redis.from_url(redis_server.url) as probe:
        for stale in probe.scan_iter("studio:rl:*"):
            probe.delete(stale)
    with (
        running("serve", variables) as (first, _),
        running("serve", variables) as (second, _),
    ):
        statuses = [
            _get(f"{base}/api/square") for _ in range(6) for base in (first, second)
        ]
    assert statuses.count(200) == 7
    assert statuses.count(429) == 5


async def test_a_spoofed_forwarded_for_from_an_untrusted_peer_is_ignored(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Rotating X-Forwarded-For does not give a client new buckets."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("gallery", 4, 60, 2)
    )
    statuses = [
        (
            await client.get(
                "/api/square", headers={"X-Forwarded-For": f"198.51.100.{i}"}
            )
        ).status
        for i in range(3)
    ]
    assert statuses == [200, 200, 429]
    assert [k async for k in redis.scan_iter("studio:rl:v1:{ip4:127.0.0.1}:*")]


async def test_a_trusted_proxy_passes_on_the_right_most_untrusted_hop(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Behind our proxy each client has its own bucket; forged left hops are ignored."""
    client = await _limited(
        aiohttp_client,
        make_settings,
        STUDIO_TRUSTED_PROXIES="127.0.0.0/8, 10.0.0.0/8",
        **_limits("gallery", 4, 60, 2),
    )
    for forged in ("1.1.1.1", "2.2.2.2", "3.3.3.3"):
        header = f"{forged}, 203.0.113.9, 10.1.2.3"
        response = await client.get("/api/square", headers={"X-Forwarded-For": header})
        assert response.status in (200, 429)
    keys = [k.decode() async for k in redis.scan_iter("studio:rl:v1:*")]
    assert keys == ["studio:rl:v1:{ip4:203.0.113.9}:gallery"]
    other = await client.get("/api/square", headers={"X-Forwarded-For": "203.0.113.10"})
    assert other.status == 200


@pytest.mark.parametrize(
    ("first", "second", "shared"),
    [
        ("2001:db8:1:2::1", "2001:db8:1:2:ffff:ffff:ffff:ffff", True),
        ("2001:db8:1:2::1", "2001:db8:1:3::1", False),
        ("::ffff:203.0.113.7", "203.0.113.7", True),
        ("[2001:db8:1:2::5]:4711", "2001:db8:1:2::6", True),
    ],
)
async def test_addresses_of_one_client_share_a_bucket(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    first: str,
    second: str,
    shared: bool,
) -> None:
    """IPv6 by /64, IPv4-mapped IPv6 as IPv4."""
    client = await _limited(
        aiohttp_client,
        make_settings,
        STUDIO_TRUSTED_PROXIES="127.0.0.1/32",
        **_limits("gallery", 2, 3600, 1),
    )
    assert (
        await client.get("/api/square", headers={"X-Forwarded-For": first})
    ).status == 200
    again = await client.get("/api/square", headers={"X-Forwarded-For": second})
    assert (again.status == 429) is shared


async def test_the_per_address_code_limit_holds_across_client_addresses(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Mailbox bombing from many IPs still meets the one-a-minute cooldown."""
    client = await _limited(
        aiohttp_client, make_settings, STUDIO_TRUSTED_PROXIES="127.0.0.1/32"
    )
    email = f"bomb-{uuid.uuid4().hex[:8]}@example.com"
    statuses = []
    for i in range(3):
        response = await client.post(
            "/api/auth/code",
            json={"email": email},
            headers={"X-Forwarded-For": f"198.51.100.{i}"},
        )
        statuses.append(response.status)
        if response.status == 429:
            text = await response.text()
            assert email not in text
            assert "198.51.100" not in text
            assert (await response.json())["violated-policies"] == ["code-cooldown"]
    assert statuses == [200, 429, 429]


async def test_the_per_ip_code_limit_holds_across_addresses(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """One client cannot spray codes at many addresses."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("code_ip", 4, 3600, 2)
    )
    statuses = [
        (
            await client.post("/api/auth/code", json={"email": f"ip{i}@example.com"})
        ).status
        for i in range(3)
    ]
    assert statuses == [200, 200, 429]


async def test_an_invalid_address_charges_no_address_bucket(
    client: Client, redis: Redis
) -> None:
    """400 first, and only the per-IP bucket moved."""
    response = await client.post("/api/auth/code", json={"email": "nope"})
    assert response.status == 400
    keys = [k.decode() async for k in redis.scan_iter("studio:rl:v1:*")]
    assert keys == ["studio:rl:v1:{ip4:127.0.0.1}:code-ip"]


async def test_sign_in_reports_every_policy_it_evaluated(client: Client) -> None:
    """code-ip, the address's, the network's and the mail budget's buckets show up."""
    response = await client.post(
        "/api/auth/code", json={"email": "headers@example.com"}
    )
    assert response.status == 200
    policies, states = _parsed(response)
    assert list(policies) == [
        "code-ip", "code-cooldown", "code-email-hour", "code-email-day",
        "code-net-free", "code-net", "mail-free", "mail-global",
    ]  # fmt: skip
    assert states["code-cooldown"]["r"] == 0
    assert response.headers["Cache-Control"] == "no-store"


def test_public_endpoints_have_no_rate_limit(redis_server: RedisServer) -> None:
    """The specification's endpoints are never limited, however fast they are read."""
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        **_limits("gallery", 2, 3600, 1),
    }
    with running("serve", variables) as (base, _):
        for _ in range(50):
            with urllib.request.urlopen(f"{base}/en") as response:
                assert response.status == 200
                assert "RateLimit" not in response.headers


async def test_a_remembered_denial_answers_like_the_first_one(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """The 429s served from memory carry the same headers and body as Redis's."""
    client = await _limited(
        aiohttp_client, make_settings, **_limits("gallery", 2, 3600, 1)
    )
    assert (await client.get("/api/square")).status == 200
    first = await client.get("/api/square")  # learned from Redis
    again = await client.get("/api/square")  # answered from memory
    assert first.status == again.status == 429
    names = {
        "Content-Type", "Cache-Control", "Retry-After", "RateLimit", "RateLimit-Policy",
        "X-Content-Type-Options", "Referrer-Policy",
    }  # fmt: skip
    for name in names:
        assert first.headers[name] == again.headers[name], name
    assert await first.json() == await again.json()


async def test_a_remembered_denial_leaves_cross_origin_and_cookie_refusals_first(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """CONTRACT §3: a state-changing request passes the cross-origin check first.

    A client Redis refused is answered from memory, but not a request the
    layers below refuse anyway: a foreign write gets its 403, an oversized
    Cookie its 400, and neither spends a token.
    """
    client = await _limited(
        aiohttp_client, make_settings, **_limits("verify_ip", 2, 3600, 1)
    )
    body = {"email": "a@example.com", "code": "12345678"}
    assert (await client.post("/api/auth/verify", json=body)).status == 400
    learned = await client.post("/api/auth/verify", json=body)
    assert learned.status == 429  # learned from Redis, remembered from now on
    refusals = [
        ({"Sec-Fetch-Site": "cross-site"}, 403, "CROSS_ORIGIN"),
        ({"Sec-Fetch-Site": "same-site"}, 403, "CROSS_ORIGIN"),
        ({"Origin": "http://evil.example"}, 403, "CROSS_ORIGIN"),
        ({"Cookie": "a=" + "x" * 5000}, 400, "BAD_REQUEST"),
    ]
    for headers, status, code in refusals:
        response = await client.post("/api/auth/verify", json=body, headers=headers)
        assert response.status == status, headers
        assert (await response.json())["error"] == code
        assert response.headers["X-Content-Type-Options"] == "nosniff"
    # the same site is still refused from memory
    same = await client.post(
        "/api/auth/verify", json=body, headers={"Sec-Fetch-Site": "same-origin"}
    )
    assert same.status == 429
    assert same.headers["RateLimit"] == learned.headers["RateLimit"]
