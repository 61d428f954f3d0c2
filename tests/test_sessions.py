"""The session boundary of /api, and the life of a session in Redis."""

from __future__ import annotations

import inspect
import json
import re
import time
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.auth.sessions import (
    ABSOLUTE_SECONDS,
    IDLE_SECONDS,
    SessionStore,
    is_anonymous,
    session_key,
    sessions_index_key,
)
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, Client, SettingsFactory, forget_limits
from .ports import free_port
from .processes import studio_environ
from .raw_http import exchange
from .workbench import new_address, sign_in, studio_command

# The anonymous /api routes (sign-in and the square); everything else needs a session.
ANONYMOUS = {
    "auth_code",
    "auth_verify",
    "auth_logout",
    "square_list",
    "square_item",
    "square_report",  # anyone may report a work in the square (CONTRACT §11)
    "report_status",  # and read how the report stands, with its id
    "models",
    "packs",
    "presets",
}


def _api_routes(app: web.Application) -> list[web.AbstractRoute]:
    """Walk the router as it was built, not the modules' own route lists."""
    routes = [
        route
        for route in app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith("/api/")
    ]
    assert routes, "no /api routes"
    return routes


def _declared(route: web.AbstractRoute) -> Handler:
    """See through the boundary's layers to the handler a module declared."""
    handler: Handler = inspect.unwrap(route.handler)
    return handler


def test_only_the_sign_in_routes_are_anonymous(make_settings: SettingsFactory) -> None:
    """The marker is on exactly the routes that must work without a session."""
    routes = _api_routes(create_app(make_settings()))
    assert {r.name for r in routes if is_anonymous(_declared(r))} == ANONYMOUS


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer anything"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Cookie": "studio_session=" + "A" * 43},
        {"Cookie": "studio_session=not-a-token"},
    ],
)
async def test_every_session_route_answers_401_before_its_handler(
    client: Client, headers: dict[str, str]
) -> None:
    """Walk the router: no cookie, an unknown cookie, or a bearer token: NO_SESSION."""
    routes = [r for r in _api_routes(client.app) if not is_anonymous(_declared(r))]
    assert routes
    for route in routes:
        canonical = route.resource.canonical if route.resource else ""
        path = re.sub(r"\{[^}]+\}", "x", canonical)  # any value for a placeholder
        response = await client.request(route.method, path, headers=headers)
        assert response.status == 401, path
        if route.method != "HEAD":
            assert await response.json() == {"error": "NO_SESSION"}


async def test_an_unknown_cookie_is_cleared(client: Client) -> None:
    """The 401 for a dead cookie tells the browser to drop it."""
    response = await client.get(
        "/api/me", headers={"Cookie": "studio_session=" + "B" * 43}
    )
    assert response.status == 401
    assert "studio_session=" in response.headers["Set-Cookie"]
    assert "Max-Age=0" in response.headers["Set-Cookie"]


async def test_a_cookie_of_bytes_that_are_not_utf_8_is_no_session(
    client: Client,
) -> None:
    """Raw bytes no browser sends: 401 NO_SESSION like any unknown cookie, not 500."""
    answer = await exchange(
        client.make_url("/"),
        b"GET /api/me HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        b"Cookie: studio_session=\xe9\xff\r\n\r\n",
    )
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.split(b"\r\n")[0] == b"HTTP/1.1 401 Unauthorized"
    assert json.loads(body) == {"error": "NO_SESSION"}


async def test_a_session_idles_out_after_seven_days(redis: Redis) -> None:
    """The key's TTL is the idle expiry; a missing key is no session."""
    store = SessionStore(redis)
    token, session = await store.create("d" * 32)
    assert IDLE_SECONDS - 5 <= await redis.ttl(session.key) <= IDLE_SECONDS
    await redis.delete(session.key)
    assert await store.load(token) is None


async def test_a_session_ends_thirty_days_after_sign_in(redis: Redis) -> None:
    """Past the absolute expiry the session is deleted even if it was used."""
    store = SessionStore(redis)
    token, session = await store.create("e" * 32)
    old = int(time.time()) - ABSOLUTE_SECONDS - 1
    await redis.hset(session.key, mapping={"created": old, "seen": int(time.time())})
    assert await store.load(token) is None
    assert not await redis.exists(session.key)


async def test_last_seen_is_refreshed_at_most_hourly(redis: Redis) -> None:
    """A recent session is read without a write; an hour later it is touched."""
    store = SessionStore(redis)
    token, session = await store.create("f" * 32)
    await redis.expire(session.key, 1000)
    loaded = await store.load(token)
    assert loaded is not None
    assert await redis.ttl(session.key) <= 1000  # untouched
    hour_ago = int(time.time()) - 3601
    await redis.hset(session.key, "seen", hour_ago)
    touched = await store.load(token)
    assert touched is not None
    assert touched.seen > hour_ago
    assert await redis.ttl(session.key) > 1000


async def test_the_store_keeps_only_the_hash_of_the_token(redis: Redis) -> None:
    """The raw token appears in no key and no value."""
    store = SessionStore(redis)
    token, session = await store.create("0" * 32)
    assert session.key == session_key(token)
    assert token not in session.key
    for value in (await redis.hgetall(session.key)).values():
        assert token.encode() not in value


async def test_a_partial_record_is_no_session(redis: Redis) -> None:
    """A hash without its fields (a touch racing a logout) is refused, not a crash."""
    store = SessionStore(redis)
    token, session = await store.create("1" * 32)
    await redis.delete(session.key)
    await redis.hset(session.key, "seen", 1)
    assert await store.load(token) is None


async def test_touching_never_brings_back_an_ended_session(redis: Redis) -> None:
    """A touch racing a logout finds no key and writes nothing."""
    store = SessionStore(redis)
    _, session = await store.create("2" * 32)
    now = int(time.time())
    assert await store.touch(session.key, session.created, now)
    await redis.delete(session.key)  # the logout lands first
    assert not await store.touch(session.key, session.created, now + 3600)
    assert not await redis.exists(session.key)


async def test_sign_out_everywhere_ends_every_session_of_the_account(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
) -> None:
    """Two browsers, one account: logout-everywhere from one ends both."""
    phone = await aiohttp_client(create_app(make_settings()))
    laptop = await aiohttp_client(create_app(make_settings()))
    email = new_address()
    me = await sign_in(phone, mail_server, email)
    await forget_limits(redis)  # what waiting out the address's cooldown would do
    await sign_in(laptop, mail_server, email)
    assert (await laptop.get("/api/me")).status == 200
    index = await redis.zcard(sessions_index_key(me["id"]))
    assert index == 2
    response = await phone.post("/api/auth/logout-everywhere")
    assert response.status == 204
    assert response.cookies["studio_session"].value == ""
    assert (await laptop.get("/api/me")).status == 401
    assert (await phone.get("/api/me")).status == 401
    assert [k async for k in redis.scan_iter("studio:session:*")] == []
    # the operator's way: sign in again, then revoke from the shell
    await forget_limits(redis)
    await sign_in(laptop, mail_server, email)
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    done = await studio_command("sessions", "revoke", email, environ=environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1 sessions ended"
    assert (await laptop.get("/api/me")).status == 401
    unknown = await studio_command(
        "sessions", "revoke", "nobody@example.com", environ=environ
    )
    assert unknown.returncode == 1


async def test_logout_clears_the_cookie_even_when_redis_is_gone(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    tmp_path: Path,
) -> None:
    """Redis stopped: 503, but the browser forgets the session cookie all the same."""
    server = RedisServer(port=free_port(), data_dir=tmp_path / "redis")
    server.start()
    try:
        client = await aiohttp_client(
            create_app(make_settings(STUDIO_REDIS_URL=server.url))
        )
        await sign_in(client, mail_server)
        server.stop()
        response = await client.post("/api/auth/logout")
        assert response.status == 503
        assert await response.json() == {"error": "UNAVAILABLE"}
        assert response.cookies["studio_session"].value == ""
    finally:
        server.stop()
