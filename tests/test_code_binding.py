"""Codes only their requester can spend, and device cookies against targeted lockout."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, Client, SettingsFactory, latest_code
from .processes import running

Browser = aiohttp.ClientSession
CODE_TTL = 600
YEAR = 365 * 24 * 3600


def _address() -> str:
    return f"bound-{uuid.uuid4().hex[:10]}@example.com"


def _wrong(code: str, n: int = 1) -> str:
    return f"{(int(code) + n) % 10**8:08d}"


@asynccontextmanager
async def _browsers(base_url: str) -> AsyncIterator[Callable[..., Browser]]:
    """Open browsers of their own (own cookie jar, own source address) on demand."""
    async with AsyncExitStack() as stack:

        def browser(source: str = "127.0.0.1") -> Browser:
            session = aiohttp.ClientSession(
                base_url,
                cookie_jar=aiohttp.CookieJar(unsafe=True),
                connector=aiohttp.TCPConnector(local_addr=(source, 0)),
            )
            stack.push_async_callback(session.close)
            return session

        yield browser


@pytest.fixture
async def browsers(client: Client) -> AsyncIterator[Callable[..., Browser]]:
    """Browsers on the test app, each a stranger to the others."""
    async with _browsers(str(client.make_url("/"))) as browser:
        yield browser


async def _ask(browser: Browser, email: str) -> aiohttp.ClientResponse:
    async with browser.post("/api/auth/code", json={"email": email}) as response:
        await response.read()
        return response


async def _try(browser: Browser, email: str, code: str) -> tuple[int, str]:
    """Submit a code; return the status and the error code (or "" on success)."""
    async with browser.post(
        "/api/auth/verify", json={"email": email, "code": code}
    ) as response:
        body: dict[str, Any] = await response.json()
        return response.status, body.get("error", "")


def _cookie(browser: Browser, name: str) -> str | None:
    found = [c.value for c in browser.cookie_jar if c.key == name]
    return found[0] if found else None


async def _code_keys(redis: Redis) -> list[bytes]:
    return [key async for key in redis.scan_iter("studio:code:*")]


async def _forget_address_buckets(redis: Redis) -> None:
    """What waiting out the per-address buckets would do, devices untouched."""
    async for key in redis.scan_iter("studio:rl:v1:{em:*"):
        await redis.delete(key)


async def _signed_in_device(
    browser: Browser, mail_server: MailCatcher, redis: Redis, email: str
) -> str:
    """Sign in through the real flow, sign out, let the address's buckets refill.

    Returns the device cookie the sign-in left in the browser.
    """
    assert (await _ask(browser, email)).status == 200
    assert await _try(browser, email, latest_code(mail_server, email)) == (200, "")
    async with browser.post("/api/auth/logout") as response:
        assert response.status == 204
    device = _cookie(browser, "studio_device")
    assert device
    await _forget_address_buckets(redis)
    return device


async def test_a_code_request_sets_the_signin_binding_cookie(
    browsers: Callable[..., Browser],
) -> None:
    """studio_signin: random, HttpOnly, SameSite=Lax, Path=/api/auth, ten minutes."""
    first, second = browsers(), browsers()
    bindings = []
    for browser in (first, second):
        response = await _ask(browser, _address())
        assert response.status == 200
        cookie = response.cookies["studio_signin"]
        assert cookie["httponly"]
        assert cookie["samesite"] == "Lax"
        assert cookie["path"] == "/api/auth"
        assert int(cookie["max-age"]) == CODE_TTL
        assert not cookie["domain"]
        assert not cookie["secure"]  # the test base URL is http
        assert len(cookie.value) >= 43
        bindings.append(cookie.value)
    assert bindings[0] != bindings[1]


async def test_the_signin_cookie_is_secure_under_https(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """A production (https) base URL adds Secure."""
    settings = make_settings(STUDIO_BASE_URL="https://studio.example")
    client = await aiohttp_client(create_app(settings))
    response = await client.post("/api/auth/code", json={"email": _address()})
    assert response.status == 200
    assert response.cookies["studio_signin"]["secure"]


async def test_a_code_is_accepted_only_with_its_bindings_cookie(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """Without the cookie, or with another binding's, the right code is INVALID_CODE."""
    victim, stranger = browsers(), browsers("127.0.0.2")
    email = _address()
    assert (await _ask(victim, email)).status == 200
    code = latest_code(mail_server, email)

    assert await _try(stranger, email, code) == (400, "INVALID_CODE")
    await _forget_address_buckets(redis)
    assert (await _ask(stranger, email)).status == 200  # a binding of its own
    theirs = latest_code(mail_server, email)
    if theirs != code:
        assert await _try(stranger, email, code) == (400, "INVALID_CODE")
    forged = browsers()
    forged.cookie_jar.update_cookies({"studio_signin": "A" * 43})
    assert await _try(forged, email, code) == (400, "INVALID_CODE")

    assert await _try(victim, email, code) == (200, "")
    assert await _try(stranger, email, theirs) == (200, "")


async def test_strangers_guesses_do_not_touch_the_victims_attempts(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """Dozens of wrong guesses from others; the victim still has all five tries."""
    victim, email = browsers(), _address()
    assert (await _ask(victim, email)).status == 200
    code = latest_code(mail_server, email)
    anonymous, stranger = browsers("127.0.0.2"), browsers("127.0.0.3")
    await _forget_address_buckets(redis)
    assert (await _ask(stranger, email)).status == 200
    theirs = latest_code(mail_server, email)
    guesses = [_wrong(code, n) for n in range(1, 21) if _wrong(code, n) != theirs]
    answers = await asyncio.gather(
        *(_try(anonymous, email, guess) for guess in guesses),
        *(_try(stranger, email, guess) for guess in guesses[:5]),
    )
    assert answers.count((400, "CODE_EXPIRED_REQUEST_NEW")) == 1  # the stranger's
    for n in range(1, 5):
        assert await _try(victim, email, _wrong(code, 100 + n)) == (400, "INVALID_CODE")
    assert await _try(victim, email, code) == (200, "")


async def test_only_the_binding_that_spent_the_attempts_hears_request_new(
    browsers: Callable[..., Browser], mail_server: MailCatcher
) -> None:
    """The fifth wrong try answers CODE_EXPIRED_REQUEST_NEW to its binding only."""
    victim, email = browsers(), _address()
    assert (await _ask(victim, email)).status == 200
    code = latest_code(mail_server, email)
    prober = browsers("127.0.0.2")
    # A prober without the binding cannot tell a live code from none.
    for n in range(1, 8):
        assert await _try(prober, email, _wrong(code, n)) == (400, "INVALID_CODE")
    answers = [await _try(victim, email, _wrong(code, n)) for n in range(1, 6)]
    assert answers == [(400, "INVALID_CODE")] * 4 + [(400, "CODE_EXPIRED_REQUEST_NEW")]
    assert await _try(victim, email, code) == (400, "INVALID_CODE")  # burned
    assert await _try(prober, email, code) == (400, "INVALID_CODE")


async def test_another_clients_request_neither_replaces_nor_burns_the_code(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """Several bindings hold live codes for one address at once."""
    victim, email = browsers(), _address()
    assert (await _ask(victim, email)).status == 200
    code = latest_code(mail_server, email)
    strangers = [browsers(f"127.0.0.{n}") for n in (2, 3, 4)]
    for stranger in strangers:
        await _forget_address_buckets(redis)
        assert (await _ask(stranger, email)).status == 200
        assert await _try(stranger, email, _wrong(code)) == (400, "INVALID_CODE")
    assert len(await _code_keys(redis)) == 4
    tags = {key.decode().split(":")[2] for key in await _code_keys(redis)}
    assert len(tags) == 1  # one hash tag: the per-address scripts stay in one slot
    assert await _try(victim, email, code) == (200, "")
    assert len(await _code_keys(redis)) == 3


async def test_a_resend_replaces_only_the_same_bindings_code(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """One live code per address and binding; the cookie keeps its binding."""
    browser, email = browsers(), _address()
    first = await _ask(browser, email)
    old = latest_code(mail_server, email)
    await _forget_address_buckets(redis)
    second = await _ask(browser, email)
    new = latest_code(mail_server, email)
    assert first.cookies["studio_signin"].value == second.cookies["studio_signin"].value
    assert len(await _code_keys(redis)) == 1
    if old != new:
        assert await _try(browser, email, old) == (400, "INVALID_CODE")
    assert await _try(browser, email, new) == (200, "")


async def test_a_successful_verify_ends_the_binding_and_sets_a_device_cookie(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """studio_signin is cleared; studio_device lives a year, bound to the account."""
    browser, email = browsers(), _address()
    await _ask(browser, email)
    async with browser.post(
        "/api/auth/verify",
        json={"email": email, "code": latest_code(mail_server, email)},
    ) as response:
        assert response.status == 200
        account = (await response.json())["user"]["id"]
        cleared = response.cookies["studio_signin"]
        device = response.cookies["studio_device"]
    assert cleared.value == "" or int(cleared["max-age"]) == 0
    assert device["httponly"]
    assert device["samesite"] == "Lax"
    assert device["path"] == "/api/auth"
    assert int(device["max-age"]) == YEAR
    assert not device["domain"]
    assert _cookie(browser, "studio_signin") is None
    stored = [key async for key in redis.scan_iter("studio:acct:*:device:*")]
    assert len(stored) == 1
    assert stored[0].decode().startswith(f"studio:acct:{{{account}}}:device:")
    assert YEAR - 5 <= await redis.ttl(stored[0]) <= YEAR
    token = device.value.split(".", 1)[1]
    assert token not in stored[0].decode()
    assert token.encode() not in (await redis.get(stored[0]) or b"")


async def test_signing_in_again_keeps_the_device_cookie(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """One browser, one device record, however often it signs in."""
    browser, email = browsers(), _address()
    first = await _signed_in_device(browser, mail_server, redis, email)
    await _forget_address_buckets(redis)
    async for key in redis.scan_iter("studio:rl:v1:{dev:*"):
        await redis.delete(key)
    assert await _signed_in_device(browser, mail_server, redis, email) == first
    assert len([k async for k in redis.scan_iter("studio:acct:*:device:*")]) == 1


async def test_a_device_keeps_its_own_quota_when_the_address_is_spent(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """Strangers spend the address's buckets; its owner's browser still gets a code."""
    owner, email = browsers(), _address()
    await _signed_in_device(owner, mail_server, redis, email)
    stranger = browsers("127.0.0.2")
    assert (await _ask(stranger, email)).status == 200
    refused = await _ask(stranger, email)
    assert refused.status == 429
    assert "code-cooldown" in refused.headers["RateLimit-Policy"]
    fresh = await _ask(browsers(), email)  # the owner on a browser never signed in
    assert fresh.status == 429

    allowed = await _ask(owner, email)
    assert allowed.status == 200
    policies = allowed.headers["RateLimit-Policy"]
    assert '"code-device-cooldown"' in policies
    assert '"code-cooldown"' not in policies
    assert await _try(owner, email, latest_code(mail_server, email)) == (200, "")
    again = await _ask(owner, email)  # the device has a cooldown of its own
    assert again.status == 429
    assert (await again.json())["violated-policies"] == ["code-device-cooldown"]


async def test_a_device_cookie_for_another_address_counts_as_anonymous(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """A device signed in with X asks for Y: Y's anonymous buckets, Y's limits."""
    owner = browsers()
    await _signed_in_device(owner, mail_server, redis, _address())
    other = _address()
    assert (await _ask(browsers("127.0.0.2"), other)).status == 200
    refused = await _ask(owner, other)
    assert refused.status == 429
    assert (await refused.json())["violated-policies"] == ["code-cooldown"]


async def test_a_forged_device_cookie_counts_as_anonymous(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """The owner's account id with a made-up token buys no quota."""
    owner, email = browsers(), _address()
    device = await _signed_in_device(owner, mail_server, redis, email)
    account = device.split(".", 1)[0]
    assert (await _ask(browsers("127.0.0.2"), email)).status == 200
    for forged in (f"{account}.{'A' * 43}", f"{account}.", "garbage", "x" * 300):
        attacker = browsers("127.0.0.3")
        attacker.cookie_jar.update_cookies({"studio_device": forged})
        response = await _ask(attacker, email)
        assert response.status == 429, forged
        assert (await response.json())["violated-policies"] == ["code-cooldown"]


def _shape(response: aiohttp.ClientResponse) -> dict[str, str]:
    """Headers with their per-request values blanked: what must match exactly."""
    varying = {"Date", "Set-Cookie", "RateLimit"}
    shape = {k: ("*" if k in varying else v) for k, v in response.headers.items()}
    shape["Set-Cookie"] = ";".join(
        f"{name}={'*'}; {str(morsel.output(header='')).split(';', 1)[1].strip()}"
        for name, morsel in response.cookies.items()
    )
    return shape


async def test_known_and_unknown_addresses_answer_alike_to_a_device_holder(
    browsers: Callable[..., Browser], mail_server: MailCatcher, redis: Redis
) -> None:
    """A stranger carrying a device cookie of their own learns nothing of others."""
    known = _address()
    await _signed_in_device(browsers(), mail_server, redis, known)
    stranger = browsers("127.0.0.2")
    await _signed_in_device(stranger, mail_server, redis, _address())
    answers = []
    for email in (known, _address()):
        async with stranger.post("/api/auth/code", json={"email": email}) as response:
            answers.append((response.status, await response.read(), _shape(response)))
    assert answers[0] == answers[1]
    assert answers[0][0] == 200
    assert '"code-cooldown"' in answers[0][2]["RateLimit-Policy"]


async def test_the_attack_on_a_victim_fails_against_the_real_server(
    redis_server: RedisServer, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """Attackers on other loopback addresses burn and re-request; the victim signs in.

    Issue 15's lockout run at a one-second cooldown, with every other limit at
    its default: each round an attacker from a new source address asks for a
    code for the victim's address and burns it with five wrong guesses.
    """
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_SMTP_HOST": mail_server.host,
        "STUDIO_SMTP_PORT": str(mail_server.port),
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_LIMITS_CODE_COOLDOWN_WINDOW": "1",
    }
    with running("serve", variables) as (base_url, _):
        async with _browsers(base_url) as browser:
            victim, email = browser("127.0.0.2"), _address()
            assert (await _ask(victim, email)).status == 200
            code = latest_code(mail_server, email)
            attacks: list[int] = []
            for n in range(10, 14):
                await asyncio.sleep(1.05)  # the cooldown: one request a second
                attacker = browser(f"127.0.0.{n}")
                attacks.append((await _ask(attacker, email)).status)
                burned = [await _try(attacker, email, _wrong(code, i)) for i in (1, 2)]
                burned += [await _try(attacker, email, "00000000") for _ in range(3)]
                expected = "CODE_EXPIRED_REQUEST_NEW" if attacks[-1] == 200 else ""
                assert burned[-1] == (400, expected or "INVALID_CODE")
            # The hour bucket (burst 3) is spent: the victim's 1 and two attackers'.
            assert attacks == [200, 200, 429, 429]
            assert await _try(victim, email, code) == (200, "")
            async with victim.post("/api/auth/logout") as response:
                assert response.status == 204

            # The address's anonymous quota is spent, for anyone without a device...
            anonymous = await _ask(browser("127.0.0.3"), email)
            assert anonymous.status == 429
            assert int(anonymous.headers["Retry-After"]) > 600
            # ...but the victim's browser, which signed in before, gets its code.
            assert (await _ask(victim, email)).status == 200
            fresh = latest_code(mail_server, email)
            assert await _try(victim, email, fresh) == (200, "")
