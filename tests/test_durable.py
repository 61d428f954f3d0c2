"""STUDIO_REDIS_WAIT_REPLICAS: a money-moving answer waits for a replica, or is 503.

A real master with a real replica (the tests' own server binary, REPLICAOF on
the command line); the replica is paused with SIGSTOP, so WAIT times out as it
would behind a stalled or cut-off replica.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis import Redis as SyncRedis
from redis.asyncio import Redis

from service.store.durable import WAIT_MS
from service.store.embedded import MailCatcher, RedisServer, find_server_binary

from .conftest import TEST_SECRET, MakeClient, SettingsFactory
from .logs import crashes
from .ports import free_port
from .processes import studio_environ
from .shop import credits, open_shop
from .test_webhooks import acknowledged, deliver, held_payment
from .workbench import balance, ledger, sign_in, studio_command


class Replica:
    """A server replicating a master on loopback; it can be paused and resumed."""

    def __init__(self, master: RedisServer, directory: Path) -> None:
        self.master = master
        self.directory = directory  # where it keeps the master's snapshot
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 10.0) -> None:
        """Spawn it as a replica and wait until the master counts it online."""
        with SyncRedis(port=self.master.port, socket_timeout=2) as master:
            master.config_set("repl-diskless-sync-delay", 0)  # 5 s for company
        args = [
            find_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--loglevel", "warning",
            "--replicaof", "127.0.0.1", str(self.master.port),
            "--dir", str(self.directory),
        ]  # fmt: skip
        self._process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while not self.in_sync():
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.02)

    def in_sync(self) -> bool:
        """Tell whether the master sees this replica online at its own offset."""
        with SyncRedis(port=self.master.port, socket_timeout=2) as master:
            info = master.info("replication")
        replica = info.get("slave0")
        return (
            isinstance(replica, dict)
            and replica.get("state") == "online"
            and int(replica.get("offset", -1)) == int(info["master_repl_offset"])
        )

    def pause(self) -> None:
        """SIGSTOP: connected, silent, acknowledging nothing."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self, timeout: float = 10.0) -> None:
        """SIGCONT, and wait until it holds everything the master wrote."""
        assert self._process is not None
        os.kill(self._process.pid, signal.SIGCONT)
        deadline = time.monotonic() + timeout
        while not self.in_sync():
            assert time.monotonic() < deadline, "the replica never caught up"
            time.sleep(0.02)

    def stop(self) -> None:
        """Resume (a stopped process ignores SIGTERM until then) and stop it."""
        if self._process is None or self._process.poll() is not None:
            return
        os.kill(self._process.pid, signal.SIGCONT)
        self._process.terminate()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[tuple[RedisServer, Replica]]:
    """A master of the test's own, with one replica in sync."""
    with RedisServer(port=free_port()) as master:
        replica = Replica(master, tmp_path)
        try:
            replica.start()
            yield master, replica
        finally:
            replica.stop()


async def test_a_submit_no_replica_confirms_is_503_and_its_retry_charges_once(
    studio: MakeClient,
    mail_server: MailCatcher,
    replicated: tuple[RedisServer, Replica],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No answer but 503 before a replica has the debit; the retry replays it."""
    master, replica = replicated
    client = await studio(STUDIO_REDIS_URL=master.url, STUDIO_REDIS_WAIT_REPLICAS="1")
    await sign_in(client, mail_server)  # the trial grant waited for the replica
    body = {"model": "seedream-4", "prompt": "a lamp in the rain"}
    headers = {"Idempotency-Key": "lamp-1"}
    replica.pause()
    try:
        started = time.monotonic()
        refused = await client.post("/api/generations", json=body, headers=headers)
        waited = time.monotonic() - started
        assert refused.status == 503, await refused.text()
        assert await refused.json() == {"error": "UNAVAILABLE"}
        assert int(refused.headers["Retry-After"]) > 0
        assert waited >= WAIT_MS / 1000
    finally:
        replica.resume()
    retried = await client.post("/api/generations", json=body, headers=headers)
    assert retried.status == 200, await retried.text()  # the same one, replayed
    assert retried.headers.get("Idempotent-Replayed") == "true"
    generation = await retried.json()
    debits = [e for e in await ledger(client) if e["kind"] == "debit"]
    assert [e["generation_id"] for e in debits] == [generation["id"]]
    assert await balance(client) == 100 - generation["credits"]
    # with the replica back, a new submit is answered at once
    fresh = await client.post("/api/generations", json={**body, "prompt": "a kite"})
    assert fresh.status == 202, await fresh.text()
    assert "not acknowledged" in caplog.text  # the warning says why
    assert not crashes(caplog)


async def test_a_payment_no_replica_confirms_is_503_and_its_resend_credits_once(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
    replicated: tuple[RedisServer, Replica],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The provider is told to send the notice again; the resend credits once."""
    master, replica = replicated
    async with open_shop(
        aiohttp_server,
        aiohttp_client,
        make_settings,
        redis,  # the fake provider's own store
        STUDIO_REDIS_URL=master.url,
        STUDIO_REDIS_WAIT_REPLICAS="1",
    ) as shop:
        await sign_in(shop.client, mail_server)
        _, delivery = await held_payment(shop, redis, "wechatpay")
        replica.pause()
        try:
            status, answer = await deliver(shop, delivery)
        finally:
            replica.resume()
        assert (status, answer) == (503, b'{"error": "UNAVAILABLE"}')
        status, answer = await deliver(shop, delivery)  # the provider's resend
        assert acknowledged("wechatpay", status, answer), (status, answer)
        entries = (await credits(shop.client))["entries"]
        assert [e["kind"] for e in entries].count("purchase") == 1
        assert (await credits(shop.client))["balance"] == 100 + 1060
    assert not crashes(caplog)


async def test_an_operator_grant_no_replica_confirms_says_so_in_one_line(
    studio: MakeClient,
    mail_server: MailCatcher,
    replicated: tuple[RedisServer, Replica],
) -> None:
    """Done on the master, not confirmed: exit 1 and a line that warns off a rerun."""
    master, replica = replicated
    variables = {
        "STUDIO_REDIS_URL": master.url,
        "STUDIO_REDIS_WAIT_REPLICAS": "1",
        "STUDIO_SECRET_KEY": TEST_SECRET,
    }
    client = await studio(**variables)
    user = await sign_in(client, mail_server)
    replica.pause()
    try:
        granted = await studio_command(
            "credits", "grant", user["email"], "5", environ=studio_environ(**variables)
        )
    finally:
        replica.resume()
    assert granted.returncode == 1
    assert granted.stderr.splitlines()[-1] == (
        "studio: done on the master but confirmed by 0 of 1 replicas within 500 ms"
        " (STUDIO_REDIS_WAIT_REPLICAS): check before running it again"
    )
    assert "Traceback" not in granted.stderr
    assert await balance(client) == 105  # it is there: a rerun would grant twice
