"""Sign-in when the mail relay or Redis fails: 503 in time, nothing left half-done."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import http_sf
import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import MailCatcher, RedisServer

from .conftest import Client, SettingsFactory, collector_paused, latest_code
from .ports import free_port


class FlakyRelay(MailCatcher):
    """An aiosmtpd server that can refuse, hang or hold at DATA, then recover."""

    mode = "ok"

    def __init__(self) -> None:
        super().__init__()
        # "hold": DATA waits until `release` is set, then refuses the message.
        self.holding = threading.Event()
        self.release = threading.Event()

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        if self.mode == "hold":
            self.holding.set()
            await asyncio.to_thread(self.release.wait, 30)
            return "554 5.7.1 Rejected for this test"
        if self.mode == "refuse":
            return "554 5.7.1 Rejected for this test"
        if self.mode == "hang":
            await asyncio.sleep(30)
        return await super().handle_DATA(server, session, envelope)


@pytest.fixture
def relay() -> Iterator[FlakyRelay]:
    catcher = FlakyRelay()
    catcher.start()
    yield catcher
    catcher.stop()


@pytest.fixture
async def flaky_client(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, relay: FlakyRelay
) -> Client:
    settings = make_settings(
        STUDIO_SMTP_PORT=str(relay.port), STUDIO_SMTP_TIMEOUT="0.5"
    )
    return await aiohttp_client(create_app(settings))


def _address() -> str:
    return f"fault-{uuid.uuid4().hex[:10]}@example.com"


_ADDRESS_BUCKETS = ("code-cooldown", "code-email-hour", "code-email-day")


@pytest.mark.parametrize("mode", ["refuse", "hang"])
async def test_a_failing_relay_gives_503_in_time_and_a_retry_works(
    flaky_client: Client, relay: FlakyRelay, redis: Redis, mode: str
) -> None:
    """No code stays valid after a failed send; the address may ask again at once."""
    email = _address()
    relay.mode = mode
    with collector_paused():
        started = time.monotonic()
        failed = await flaky_client.post("/api/auth/code", json={"email": email})
        assert time.monotonic() - started < 1.5
    assert failed.status == 503
    assert await failed.json() == {"error": "MAIL_UNAVAILABLE"}
    assert int(failed.headers["Retry-After"]) > 0
    assert [key async for key in redis.scan_iter("studio:code:*")] == []
    # its RateLimit shows the address's buckets full again (default bursts 1, 3, 10)
    parsed = http_sf.parse(failed.headers["RateLimit"].encode(), tltype="list")
    states: dict[str, Any] = dict(parsed)  # type: ignore[arg-type]
    given_back = {name: states[name]["r"] for name in _ADDRESS_BUCKETS}
    assert given_back == {
        "code-cooldown": 1,
        "code-email-hour": 3,
        "code-email-day": 10,
    }

    relay.mode = "ok"
    retried = await flaky_client.post("/api/auth/code", json={"email": email})
    assert retried.status == 200
    code = latest_code(relay, email)
    verify = await flaky_client.post(
        "/api/auth/verify", json={"email": email, "code": code}
    )
    assert verify.status == 200


async def test_a_relay_that_never_greets_times_out_within_the_deadline(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory
) -> None:
    """A socket that accepts and stays silent costs one deadline, not a hang."""
    silent: list[asyncio.StreamWriter] = []

    async def accept(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)

    port = free_port()
    server = await asyncio.start_server(accept, "127.0.0.1", port)
    settings = make_settings(STUDIO_SMTP_PORT=str(port), STUDIO_SMTP_TIMEOUT="0.5")
    client = await aiohttp_client(create_app(settings))
    with collector_paused():
        started = time.monotonic()
        response = await client.post("/api/auth/code", json={"email": _address()})
        assert time.monotonic() - started < 1.5
    assert response.status == 503
    for writer in silent:
        writer.close()
    server.close()
    await server.wait_closed()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer(port=free_port()) as server:
        yield server


@pytest.fixture
async def stoppable(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    own_redis: RedisServer,
) -> Client:
    return await aiohttp_client(
        create_app(make_settings(STUDIO_REDIS_URL=own_redis.url))
    )


async def test_redis_down_gives_503_never_500_and_sign_in_recovers(
    stoppable: Client, own_redis: RedisServer, mail_server: MailCatcher
) -> None:
    """Every sign-in step fails closed while Redis is gone and works once it is back."""
    email = _address()
    assert (await stoppable.post("/api/auth/code", json={"email": email})).status == 200
    own_redis.stop()
    for method, path, body in (
        ("POST", "/api/auth/code", {"email": email}),
        ("POST", "/api/auth/verify", {"email": email, "code": "12345678"}),
        ("GET", "/api/me", None),
    ):
        with collector_paused():
            started = time.monotonic()
            response = await stoppable.request(
                method,
                path,
                json=body,
                headers={"Cookie": "studio_session=" + "C" * 43},
            )
            assert time.monotonic() - started < 1.5, path
        assert response.status == 503, path
        assert await response.json() == {"error": "UNAVAILABLE"}
        assert int(response.headers["Retry-After"]) > 0
    assert (await stoppable.get("/healthz")).status == 200

    own_redis.start()
    assert (await stoppable.post("/api/auth/code", json={"email": email})).status == 200
    code = latest_code(mail_server, email)
    verify = await stoppable.post(
        "/api/auth/verify", json={"email": email, "code": code}
    )
    assert verify.status == 200


async def test_no_code_token_or_cookie_reaches_the_logs(
    client: Client, mail_server: MailCatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """Capture every log record of a whole sign-in and search it for secrets."""
    email = _address()
    with caplog.at_level(logging.DEBUG):
        await client.post("/api/auth/code", json={"email": email})
        code = latest_code(mail_server, email)
        await client.post("/api/auth/verify", json={"email": email, "code": "00000000"})
        verify = await client.post(
            "/api/auth/verify", json={"email": email, "code": code}
        )
        token = verify.cookies["studio_session"].value
        await client.get("/api/me")
        await client.post("/api/auth/logout")
    logged = "\n".join([caplog.text, *(str(record.args) for record in caplog.records)])
    assert caplog.records, "the flow logs something"
    for secret in (code, f"{code[:4]} {code[4:]}", token):
        assert secret not in logged


async def test_a_failed_send_also_lifts_a_remembered_cooldown(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    relay: FlakyRelay,
    redis: Redis,
) -> None:
    """A double-submit refused during a failing send does not block the retry."""
    # The relay, not a timer, decides when the first send fails.
    settings = make_settings(STUDIO_SMTP_PORT=str(relay.port), STUDIO_SMTP_TIMEOUT="30")
    client = await aiohttp_client(create_app(settings))
    email = _address()
    relay.mode = "hold"
    first = asyncio.ensure_future(client.post("/api/auth/code", json={"email": email}))
    try:
        assert await asyncio.to_thread(relay.holding.wait, 30), "the send started"
        double = await client.post("/api/auth/code", json={"email": email})
        assert double.status == 429  # the cooldown, now remembered in process
    finally:
        relay.release.set()
    assert (await first).status == 503
    relay.mode = "ok"
    retried = await client.post("/api/auth/code", json={"email": email})
    assert retried.status == 200


async def test_a_spent_mail_budget_gives_the_address_its_tokens_back(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Refused by the global budget, an address is not left in its cooldown."""
    settings = make_settings(
        STUDIO_LIMITS_MAIL_GLOBAL_QUOTA="2",
        STUDIO_LIMITS_MAIL_GLOBAL_BURST="1",
        STUDIO_LIMITS_MAIL_GLOBAL_WINDOW="3600",
    )
    client = await aiohttp_client(create_app(settings))
    assert (
        await client.post("/api/auth/code", json={"email": _address()})
    ).status == 200
    refused = _address()
    response = await client.post("/api/auth/code", json={"email": refused})
    assert response.status == 429
    assert (await response.json())["violated-policies"] == ["mail-global"]
    address_buckets = [k async for k in redis.scan_iter("studio:rl:v1:{em:*")]
    assert len(address_buckets) == 3  # only the first address's, none for `refused`
