"""STUDIO_SECRET_KEY rotates: what was made under the old key carries over."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.auth.accounts import (
    INDEX_GRACE_SECONDS,
    AccountStore,
    address_index_key,
    legacy_index_key,
)
from service.auth.identity import Keyring, address_key, key_id
from service.settings import SettingsError
from service.store.embedded import MailCatcher, RedisServer
from service.studio.ledger import Ledger

from .conftest import Client, SettingsFactory, latest_code
from .processes import studio_environ
from .test_library import make_works
from .workbench import balance, new_address, sign_in, studio_command

OLD_KEY = "old-secret-key-0123456789abcdef-0123456789"
NEW_KEY = "new-secret-key-0123456789abcdef-0123456789"
OTHER_KEY = "other-secret-key-0123456789abcdef-012345678"


async def _client(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    tmp_path: Path,
    **variables: str,
) -> Client:
    settings = make_settings(STUDIO_MEDIA_DIR=str(tmp_path / "media"), **variables)
    return await aiohttp_client(create_app(settings))


def _session_cookie(client: Client) -> str:
    (cookie,) = [c for c in client.session.cookie_jar if c.key == "studio_session"]
    return cookie.value


async def test_an_account_its_session_credits_and_works_survive_a_key_rotation(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """Same address, same account id, balance, works and favorites; the cookie holds."""
    before = await _client(
        aiohttp_client, make_settings, tmp_path, STUDIO_SECRET_KEY=OLD_KEY
    )
    email = new_address()
    me = await sign_in(before, mail_server, email)
    ledger = Ledger(redis, trial_credits=100, expire_months=24)
    await ledger.adjust(me["id"], -30, "spent before the rotation")
    (work,) = await make_works(redis, tmp_path, me["id"], 1)
    assert (await before.post(f"/api/works/{work['id']}/publish")).status == 200
    assert (await before.put(f"/api/works/{work['id']}/favorite")).status == 204
    token = _session_cookie(before)
    kept = await balance(before)

    after = await _client(
        aiohttp_client,
        make_settings,
        tmp_path,
        STUDIO_SECRET_KEY=NEW_KEY,
        STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY,
    )
    # The session cookie made under the old key still works under the new one.
    cookie = {"Cookie": f"studio_session={token}"}
    same = await after.get("/api/me", headers=cookie)
    assert same.status == 200
    assert (await same.json())["id"] == me["id"]
    after.session.cookie_jar.clear()
    # A new sign-in of the same address finds the same account.
    again = await sign_in(after, mail_server, email)
    assert again["id"] == me["id"]
    assert again["credits"] == kept
    assert await balance(after) == kept
    works = await (await after.get("/api/works")).json()
    assert [(w["id"], w["favorite"]) for w in works["items"]] == [(work["id"], True)]
    assert (await after.get(f"/api/square/{work['id']}")).status == 200
    # Filed anew under the new key; the old entry outlives it for a grace period.
    new_name = address_index_key(address_key(email, NEW_KEY), key_id(NEW_KEY))
    old_name = address_index_key(address_key(email, OLD_KEY), key_id(OLD_KEY))
    assert await redis.get(new_name) == me["id"].encode()
    assert 0 < await redis.ttl(old_name) <= INDEX_GRACE_SECONDS


async def test_with_neither_key_matching_the_address_opens_a_new_account(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """A key replaced without STUDIO_SECRET_KEY_PREVIOUS orphans the account."""
    before = await _client(
        aiohttp_client, make_settings, tmp_path, STUDIO_SECRET_KEY=OLD_KEY
    )
    email = new_address()
    me = await sign_in(before, mail_server, email)
    after = await _client(
        aiohttp_client,
        make_settings,
        tmp_path,
        STUDIO_SECRET_KEY=NEW_KEY,
        STUDIO_SECRET_KEY_PREVIOUS=OTHER_KEY,
    )
    response = await after.post("/api/auth/code", json={"email": email})
    assert response.status == 200
    verified = await after.post(
        "/api/auth/verify",
        json={"email": email, "code": latest_code(mail_server, email)},
    )
    body = await verified.json()
    assert body["new_account"] is True
    assert body["user"]["id"] != me["id"]


async def test_the_operator_finds_an_account_filed_under_the_previous_key(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis_server: RedisServer,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """`credits grant` and `sessions revoke` work before the person signs in again."""
    before = await _client(
        aiohttp_client, make_settings, tmp_path, STUDIO_SECRET_KEY=OLD_KEY
    )
    email = new_address()
    await sign_in(before, mail_server, email)
    rotated = studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=NEW_KEY,
        STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY,
    )
    granted = await studio_command("credits", "grant", email, "5", environ=rotated)
    assert (granted.returncode, granted.stdout.strip()) == (0, "105"), granted.stderr
    revoked = await studio_command("sessions", "revoke", email, environ=rotated)
    assert (revoked.returncode, revoked.stdout.strip()) == (0, "1 sessions ended")
    assert (await before.get("/api/me")).status == 401
    bare = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=OTHER_KEY
    )
    unknown = await studio_command("credits", "grant", email, "5", environ=bare)
    assert unknown.returncode == 1
    assert "no account" in unknown.stderr


async def test_an_entry_filed_before_keys_had_ids_is_found_and_filed_anew(
    redis: Redis,
) -> None:
    """Index entries written by earlier versions (no key id in the name) still count."""
    ledger = Ledger(redis, trial_credits=100, expire_months=24)
    email = "legacy@example.com"
    legacy = legacy_index_key(address_key(email, OLD_KEY))
    await redis.set(legacy, "legacyid0000")
    await ledger.open("legacyid0000", email, address_key(email, OLD_KEY))
    for keyring in (Keyring(OLD_KEY), Keyring(NEW_KEY, OLD_KEY)):
        account, opened = await AccountStore(redis, ledger, keyring).open(email)
        assert (account.id, opened) == ("legacyid0000", False)
        current = address_index_key(
            address_key(email, keyring.current), key_id(keyring.current)
        )
        assert await redis.get(current) == b"legacyid0000"


async def test_concurrent_sign_ins_after_a_rotation_agree_on_the_account(
    redis: Redis,
) -> None:
    """Re-filing is a SET NX: racing finds give one id, nothing new is opened."""
    ledger = Ledger(redis, trial_credits=100, expire_months=24)
    email = "racer@example.com"
    first, _ = await AccountStore(redis, ledger, Keyring(OLD_KEY)).open(email)
    rotated = AccountStore(redis, ledger, Keyring(NEW_KEY, OLD_KEY))
    results = await asyncio.gather(*(rotated.open(email) for _ in range(10)))
    assert {(account.id, opened) for account, opened in results} == {(first.id, False)}


def test_the_previous_key_is_optional_but_never_short(
    make_settings: SettingsFactory,
) -> None:
    """STUDIO_SECRET_KEY_PREVIOUS is validated like STUDIO_SECRET_KEY."""
    assert make_settings().secret_key_previous == ""
    assert make_settings(STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY).secret_key_previous
    with pytest.raises(SettingsError, match="STUDIO_SECRET_KEY_PREVIOUS"):
        make_settings(STUDIO_SECRET_KEY_PREVIOUS="short")
    assert "old-secret" not in repr(make_settings(STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY))


async def test_refiling_lets_the_previous_key_go_without_orphaning_anyone(
    redis_server: RedisServer, redis: Redis
) -> None:
    """`studio keys refile` files dormant accounts; a clash is counted, not merged."""
    ledger = Ledger(redis, trial_credits=100, expire_months=24)
    old = AccountStore(redis, ledger, Keyring(OLD_KEY))
    dormant = [(await old.open(f"dormant{i}@example.com"))[0].id for i in range(2)]
    twice, _ = await old.open("twice@example.com")
    # Opened again while neither key matched: a second account for the address.
    other, opened = await AccountStore(redis, ledger, Keyring(NEW_KEY)).open(
        "twice@example.com"
    )
    assert opened
    rotated = studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=NEW_KEY,
        STUDIO_SECRET_KEY_PREVIOUS=OLD_KEY,
    )
    refiled = await studio_command("keys", "refile", environ=rotated)
    assert refiled.returncode == 0, refiled.stderr
    assert refiled.stdout.strip() == "2 filed, 1 already filed, 1 clashes"
    new_only = AccountStore(redis, ledger, Keyring(NEW_KEY))
    for index, account_id in enumerate(dormant):
        assert await new_only.find(f"dormant{index}@example.com") == account_id
    assert await new_only.find("twice@example.com") == other.id != twice.id
    again = await studio_command("keys", "refile", environ=rotated)
    assert again.stdout.strip() == "0 filed, 3 already filed, 1 clashes"
