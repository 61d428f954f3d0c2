"""Suspending an account: every effect of CONTRACT §11 at once, then a restore."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import time
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from service.account.deletion import PURGE_QUEUE, DeletionStore
from service.auth.accounts import KEPT_SECONDS
from service.auth.sessions import SessionStore
from service.moderation.log import ModerationLog
from service.moderation.sanctions import Sanctions
from service.moderation.suspension import (
    ADDRESS_KEPT_SECONDS,
    AccountSuspended,
    address_suspension_key,
    refuse_if_address_suspended,
    suspension_key,
)
from service.store.embedded import MailCatcher, RedisServer
from service.studio.generations import GenerationStore
from service.studio.ledger import Ledger
from service.studio.media.store import DirectoryStore

from .conftest import (
    TEST_SECRET,
    Client,
    Env,
    MakeClient,
    SettingsFactory,
    forget_limits,
    latest_code,
)
from .processes import studio_environ
from .test_library import make_works
from .workbench import (
    new_address,
    sign_in,
    studio_command,
    wait_for_status,
    worker_process,
)


async def _square(client: Client) -> list[str]:
    body = await (await client.get("/api/square")).json()
    return [item["id"] for item in body["items"]]


async def _verify(
    client: Client, mail_server: MailCatcher, email: str, redis: Redis
) -> Any:
    await forget_limits(redis)  # the address's one-a-minute cooldown
    response = await client.post("/api/auth/code", json={"email": email})
    assert response.status == 200, await response.text()
    code = latest_code(mail_server, email)
    return await client.post("/api/auth/verify", json={"email": email, "code": code})


async def test_a_suspension_ends_sessions_jobs_and_square_presence_then_a_restore(
    studio: MakeClient,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Any,
) -> None:
    """Two sessions 401, a running and a queued job refunded once, the square empty."""
    first, second, visitor = await studio(), await studio(), await studio()
    email = new_address()
    me = await sign_in(first, mail_server, email)
    await forget_limits(redis)
    await sign_in(second, mail_server, email)
    works = await make_works(redis, tmp_path, me["id"], 2)
    for work in works:
        response = await first.post(f"/api/works/{work['id']}/publish")
        assert response.status == 200
    assert sorted(await _square(visitor)) == sorted(w["id"] for w in works)
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        STUDIO_MEDIA_DIR=studio_env["STUDIO_MEDIA_DIR"],
    )
    slow = {**studio_env, "STUDIO_DEMO_SECONDS": "8", "STUDIO_WORKER_CONCURRENCY": "1"}
    ids = []
    with worker_process(slow):
        for _ in range(2):
            response = await first.post(
                "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
            )
            assert response.status == 202
            ids.append((await response.json())["id"])
        await wait_for_status(first, ids[0], {"running"})
        done = await studio_command(
            "accounts", "suspend", email, "--reason", "prohibited prompts",
            "--days", "3", environ=environ,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "2 sessions ended, 2 generations canceled and refunded, 2 works" in (
            done.stdout
        )
        for client in (first, second):
            response = await client.get("/api/me")
            assert response.status == 401
            assert await response.json() == {"error": "NO_SESSION"}
        await asyncio.sleep(2.0)  # the worker hears the cancel and stops
    generations = GenerationStore(redis)
    for gid in ids:
        fields = await generations.get(me["id"], gid)
        assert fields is not None
        assert fields["status"] == "canceled"
    page = await Ledger(redis, trial_credits=100, expire_months=24).page(
        me["id"], before=None, limit=50
    )
    refunds = [e["generation_id"] for e in page.entries if e["kind"] == "refund"]
    assert sorted(refunds) == sorted(ids)  # each exactly once
    assert page.balance == 99  # the trial, less the finished generation's 1
    assert await _square(visitor) == []
    for work in works:
        assert (await visitor.get(f"/api/square/{work['id']}")).status == 404

    # Signing in: a code is mailed as for anyone; the right code opens nothing.
    stranger = await studio()
    response = await _verify(stranger, mail_server, email, redis)
    assert response.status == 403
    body = await response.json()
    assert body["error"] == "ACCOUNT_SUSPENDED"
    until = dt.datetime.fromisoformat(body["until"])
    assert abs(until.timestamp() - (time.time() + 3 * 86400)) < 60
    assert "studio_session" not in response.cookies
    assert (await stranger.get("/api/me")).status == 401
    assert await redis.zcard(f"studio:acct:{{{me['id']}}}:sessions") == 0

    restored = await studio_command("accounts", "restore", email, environ=environ)
    assert restored.returncode == 0, restored.stderr
    again = await studio_command("accounts", "restore", email, environ=environ)
    assert again.returncode == 1
    response = await _verify(stranger, mail_server, email, redis)
    assert response.status == 200, await response.text()
    mine = await (await stranger.get("/api/works")).json()
    assert [item["published_at"] for item in mine["items"]] == [None, None]
    assert await _square(visitor) == []  # the works do not come back by themselves
    log = ModerationLog(redis, 180)
    records = [r async for r in log.read(account=me["id"])]
    assert [(r["source"], r["verdict"]) for r in records] == [
        ("operator", "suspended"),
        ("operator", "restored"),
    ]
    assert records[0]["note"] == "prohibited prompts"
    listed = await studio_command(
        "moderation", "log", "--account", email, environ=environ
    )
    assert len(listed.stdout.splitlines()) == 2
    assert json.loads(listed.stdout.splitlines()[0])["verdict"] == "suspended"


async def test_a_suspension_without_days_lasts_until_restored(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
) -> None:
    """until is null; an unknown address or a blank reason is refused with exit 1."""
    client = await studio()
    email = new_address()
    await sign_in(client, mail_server, email)
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    blank = await studio_command(
        "accounts", "suspend", email, "--reason", " ", environ=environ
    )
    assert (blank.returncode, blank.stdout) == (1, "")
    assert blank.stderr.count("\n") == 1
    done = await studio_command(
        "accounts", "suspend", email, "--reason", "r", environ=environ
    )
    assert done.returncode == 0, done.stderr
    response = await _verify(await studio(), mail_server, email, redis)
    assert await response.json() == {"error": "ACCOUNT_SUSPENDED", "until": None}
    missing = await studio_command(
        "accounts", "suspend", "nobody@example.com", "--reason", "r", environ=environ
    )
    assert missing.returncode == 1
    bad = await studio_command(
        "accounts", "suspend", email, "--reason", "r", "--days", "0", environ=environ
    )
    assert bad.returncode == 2


async def test_a_sign_in_racing_a_suspension_never_keeps_a_session(
    redis: Redis, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """Whichever comes first, no session of the suspended account survives."""
    settings = make_settings(STUDIO_MEDIA_DIR=str(tmp_path / "media"))
    deletions = DeletionStore.build(redis, settings, DirectoryStore(tmp_path / "media"))
    sanctions = Sanctions(redis, deletions, ModerationLog(redis, 180))
    sessions = SessionStore(redis)
    account, _ = await deletions.accounts.open(new_address())
    for _ in range(30):

        async def sign_in_after(delay: float) -> None:
            await asyncio.sleep(delay)
            with contextlib.suppress(AccountSuspended):
                await sessions.create(account.id)

        await asyncio.gather(
            *(sign_in_after(delay) for delay in (0, 0, 0.001, 0.002, 0.004, 0.008)),
            sanctions.suspend(account.id, "race", None, source="operator"),
        )
        index = f"studio:acct:{{{account.id}}}:sessions"
        found: list[bytes] = await redis.zrange(index, 0, -1)  # type: ignore[assignment]
        live = [key for key in found if await redis.exists(key)]
        assert live == []
        assert await sanctions.restore(account.id)


def _stores(
    redis: Redis, make_settings: SettingsFactory, media: Path
) -> tuple[DeletionStore, Sanctions]:
    settings = make_settings(STUDIO_MEDIA_DIR=str(media))
    deletions = DeletionStore.build(redis, settings, DirectoryStore(media))
    return deletions, Sanctions(redis, deletions, ModerationLog(redis, 180))


async def test_a_suspension_outlives_the_deleted_account_at_its_address(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    make_settings: SettingsFactory,
    tmp_path: Path,
) -> None:
    """Deleted first, suspended in the grace days, then purged: the address is
    refused until the suspension ends, opens no account, and the refused sign-in
    does not undo the deletion; `accounts restore EMAIL` lifts it."""
    client = await studio()
    email = new_address()
    me = await sign_in(client, mail_server, email)
    deletions, sanctions = _stores(redis, make_settings, tmp_path / "media")
    await deletions.delete(me["id"])
    done = await sanctions.suspend(me["id"], "prohibited prompts", 3, source="operator")

    stranger = await studio()
    response = await _verify(stranger, mail_server, email, redis)
    assert await response.json() == {"error": "ACCOUNT_SUSPENDED", "until": done.until}
    assert await redis.zscore(PURGE_QUEUE, me["id"]) is not None  # still deleting

    assert await deletions.purge(me["id"], now=time.time() + 8 * 86400)
    assert await deletions.accounts.find(email) is None
    assert not await redis.exists(suspension_key(me["id"]))  # the account's is gone
    response = await _verify(stranger, mail_server, email, redis)
    assert response.status == 403
    assert await response.json() == {"error": "ACCOUNT_SUSPENDED", "until": done.until}
    assert await deletions.accounts.find(email) is None  # no new account either
    (address_key, *_) = deletions.accounts.address_keys(email)
    left = await redis.ttl(address_suspension_key(address_key))
    assert 3 * 86400 - 60 < left <= 3 * 86400

    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    restored = await studio_command("accounts", "restore", email, environ=environ)
    assert restored.returncode == 0, restored.stderr
    assert "restored (its account was deleted)" in restored.stdout
    again = await studio_command("accounts", "restore", email, environ=environ)
    assert again.returncode == 1
    response = await _verify(stranger, mail_server, email, redis)
    assert response.status == 200, await response.text()
    body = await response.json()
    assert body["new_account"] is True
    assert body["user"]["id"] != me["id"]
    log = ModerationLog(redis, 180)
    verdicts = [(r["verdict"], r["account"]) async for r in log.read(account=me["id"])]
    assert verdicts == [("suspended", me["id"]), ("restored", me["id"])]


async def test_a_suspension_kept_only_on_its_account_moves_to_its_address_at_purge(
    redis: Redis, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """A suspension written before addresses were marked (the account's hash
    alone, for good) is carried to the address when the account is purged."""
    deletions, _ = _stores(redis, make_settings, tmp_path / "media")
    email = new_address()
    account, _ = await deletions.accounts.open(email)
    await redis.hset(suspension_key(account.id), mapping={"at": "2026-01-01T00:00:00Z"})
    await deletions.delete(account.id)
    keys = deletions.accounts.address_keys(email)
    marks = [address_suspension_key(key) for key in keys]
    assert not await redis.exists(*marks)
    assert await deletions.purge(account.id, now=time.time() + 8 * 86400)
    with pytest.raises(AccountSuspended) as refused:
        await refuse_if_address_suspended(redis, keys)
    assert refused.value.until is None
    left = await redis.ttl(marks[0])
    assert ADDRESS_KEPT_SECONDS - 60 < left <= ADDRESS_KEPT_SECONDS
    assert ADDRESS_KEPT_SECONDS == KEPT_SECONDS  # as long as the trial mark
