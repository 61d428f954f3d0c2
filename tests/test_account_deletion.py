"""Delete my account: at once, restored within the grace period, purged after it."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest
from aiohttp import FormData
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.account.deletion import PURGE_QUEUE, DeletionStore
from service.account.keys import DELETIONS
from service.account.purger import Purger
from service.app import create_app
from service.auth.accounts import KEPT_SECONDS, trial_key
from service.auth.identity import address_key
from service.auth.sessions import SESSIONS
from service.keys import SETTINGS
from service.payments.orders import NotRefundable, OrderStore, Pack
from service.store.connect import connect
from service.store.embedded import MailCatcher
from service.studio.ledger import AccountDeleting, UnknownAccount, account_key
from service.studio.media.store import DirectoryStore

from .cluster import Cluster
from .conftest import TEST_SECRET, Client, Env, MakeClient, SettingsFactory, latest_code
from .processes import studio_environ
from .test_library import make_works
from .workbench import (
    balance,
    new_address,
    sign_in,
    studio_command,
    wait_for_status,
    worker_process,
)

P30 = Pack("p30", 30, 300, 0)
# These tests ask for codes for one address again and again.
_CODE_POLICIES = (
    "CODE_COOLDOWN", "CODE_EMAIL_HOUR", "CODE_EMAIL_DAY",
    "CODE_DEVICE_COOLDOWN", "CODE_DEVICE_HOUR", "CODE_DEVICE_DAY",
)  # fmt: skip
CODES_AT_WILL = {
    f"STUDIO_LIMITS_{name}_{field}": value
    for name in _CODE_POLICIES
    for field, value in (("QUOTA", "100000"), ("BURST", "50000"))
}


@pytest.fixture
def studio_env(studio_env: Env) -> Env:
    """The shared settings, with codes for one address at will."""
    return {**studio_env, **CODES_AT_WILL}


async def _code_for(client: Client, mail_server: MailCatcher, email: str) -> str:
    """Ask for a code as the signed-in workbench does, and read it from the mail."""
    response = await client.post("/api/auth/code", json={"email": email})
    assert response.status == 200, await response.text()
    return latest_code(mail_server, email)


async def _delete(client: Client, code: str) -> tuple[int, dict[str, Any]]:
    response = await client.post("/api/account/delete", json={"code": code})
    return response.status, await response.json()


async def _square_ids(client: Client) -> set[str]:
    """Every id on every square page: new and top, all kinds, page by page."""
    seen: set[str] = set()
    for query in (
        {},
        {"sort": "top"},
        {"kind": "image"},
        {"sort": "top", "kind": "image"},
    ):
        cursor = ""
        while True:
            params = {**query, "limit": "2", **({"cursor": cursor} if cursor else {})}
            response = await client.get("/api/square", params=params)
            assert response.status == 200, await response.text()
            body = await response.json()
            seen |= {item["id"] for item in body["items"]}
            if not (cursor := body["next_cursor"]):
                break
    return seen


async def _publish(client: Client, works: list[dict[str, Any]]) -> None:
    for work in works:
        response = await client.post(f"/api/works/{work['id']}/publish")
        assert response.status == 200, await response.text()


async def _credits(client: Client) -> dict[str, Any]:
    response = await client.get("/api/credits")
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


def _png() -> FormData:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 10)).save(buffer, "PNG")
    form = FormData()
    form.add_field(
        "file", buffer.getvalue(), filename="a.png", content_type="image/png"
    )
    return form


async def test_deleting_ends_sessions_unlists_works_and_refunds_generations_at_once(
    studio: MakeClient,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """202 {purge_at}: every session 401, no square page shows a work, jobs refunded."""
    first, second, visitor = await studio(), await studio(), await studio()
    email = new_address()
    me = await sign_in(first, mail_server, email)
    await sign_in(second, mail_server, email)  # a second browser of mine
    works = await make_works(redis, tmp_path, me["id"], 3)
    await _publish(first, works[:2])
    assert {w["id"] for w in works[:2]} <= await _square_ids(visitor)
    before = await balance(first)
    slow = {**studio_env, "STUDIO_DEMO_SECONDS": "6"}
    with worker_process(slow):
        running = await first.post(
            "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
        )
        assert running.status == 202
        gid = (await running.json())["id"]
        await wait_for_status(first, gid, {"running"})
        code = await _code_for(first, mail_server, email)
        status, body = await _delete(first, code)
        assert status == 202, body
        await asyncio.sleep(1.0)  # the worker hears the cancel and stops
    purge_at = dt.datetime.fromisoformat(body["purge_at"]).timestamp()
    assert body["purge_at"].endswith("Z")
    assert abs(purge_at - (time.time() + 7 * 86400)) < 60
    for client in (first, second):
        for path in ("/api/me", "/api/credits", "/api/works"):
            response = await client.get(path)
            assert response.status == 401, path
            assert await response.json() == {"error": "NO_SESSION"}
    listed = await _square_ids(visitor)
    for work in works:
        assert work["id"] not in listed
        assert (await visitor.get(f"/api/square/{work['id']}")).status == 404
        assert (await visitor.get(f"/square/{work['id']}")).status == 404
    generation = await redis.hgetall(f"{account_key(me['id'])}:gen:{gid}")
    assert generation[b"status"] == b"canceled"
    assert generation[b"refunded"] == b"1"
    assert int(await redis.hget(account_key(me["id"]), "balance") or 0) == before
    media = tmp_path / "media"
    made = {p.name for p in media.rglob("*") if p.is_file()}
    assert made == {Path(w[k]).name for w in works for k in ("media_key", "thumb_key")}
    assert await redis.zscore(PURGE_QUEUE, me["id"]) == purge_at


async def test_a_request_that_raced_the_deletion_gets_no_generation_or_order(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """A session opened behind the deletion's back: 409 ACCOUNT_DELETING, no charge."""
    client = await studio()
    email = new_address()
    me = await sign_in(client, mail_server, email)
    status, _ = await _delete(client, await _code_for(client, mail_server, email))
    assert status == 202
    token, _ = await client.app[SESSIONS].create(me["id"])
    client.session.cookie_jar.update_cookies({"studio_session": token})
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
    )
    assert response.status == 409
    assert await response.json() == {"error": "ACCOUNT_DELETING"}
    assert (await _credits(client))["balance"] == 100
    with pytest.raises(AccountDeleting):
        await OrderStore(redis, order_minutes=15, expire_months=24).create(
            me["id"], P30, "alipay", "desktop"
        )


async def test_a_wrong_foreign_expired_or_unbound_code_is_invalid_and_changes_nothing(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """400 INVALID_CODE for each; the attempts count; the account stays as it was."""
    client, stranger = await studio(), await studio()
    email, other = new_address(), new_address()
    me = await sign_in(client, mail_server, email)

    async def unchanged() -> None:
        assert (await client.get("/api/me")).status == 200
        assert await redis.hget(account_key(me["id"]), "deleting") is None
        assert await redis.zscore(PURGE_QUEUE, me["id"]) is None

    # another address's code, asked for by me with my binding
    foreign = await _code_for(client, mail_server, other)
    assert await _delete(client, foreign) == (400, {"error": "INVALID_CODE"})
    await unchanged()
    # my own code, but spent from a browser without its binding
    mine = await _code_for(client, mail_server, email)
    cookie = client.session.cookie_jar.filter_cookies(client.make_url("/api/me"))
    stranger.session.cookie_jar.update_cookies(
        {"studio_session": cookie["studio_session"].value}
    )
    assert await _delete(stranger, mine) == (400, {"error": "INVALID_CODE"})
    await unchanged()
    # wrong digits until the code is burned: then even the right one fails
    for _ in range(5):
        assert await _delete(client, "00000000") == (400, {"error": "INVALID_CODE"})
    assert await _delete(client, mine) == (400, {"error": "INVALID_CODE"})
    await unchanged()
    # an expired code
    late = await _code_for(client, mail_server, email)
    async for key in redis.scan_iter(
        f"studio:code:{{{address_key(email, TEST_SECRET)}}}:*"
    ):
        await redis.pexpire(key, 1)
    await asyncio.sleep(0.05)
    assert await _delete(client, late) == (400, {"error": "INVALID_CODE"})
    await unchanged()
    for body in ({}, {"code": 12345678}, {"code": "1" * 65}):
        response = await client.post("/api/account/delete", json=body)
        assert response.status == 400
    anonymous = await studio()
    response = await anonymous.post("/api/account/delete", json={"code": mine})
    assert response.status == 401
    await unchanged()


async def test_signing_in_within_the_grace_period_restores_everything(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
    studio_env: Env,
) -> None:
    """restored: true; the works are on the square again, balance and lots as before."""
    client, visitor = await studio(), await studio()
    email = new_address()
    me = await sign_in(client, mail_server, email)
    works = await make_works(redis, tmp_path, me["id"], 2)
    await _publish(client, works[:1])
    credits = await _credits(client)
    status, _ = await _delete(client, await _code_for(client, mail_server, email))
    assert status == 202
    assert works[0]["id"] not in await _square_ids(visitor)
    response = await client.post("/api/auth/code", json={"email": email})
    assert response.status == 200
    response = await client.post(
        "/api/auth/verify",
        json={"email": email, "code": latest_code(mail_server, email)},
    )
    body = await response.json()
    assert (body["restored"], body["new_account"], body["user"]["id"]) == (
        True,
        False,
        me["id"],
    )
    assert await _credits(client) == credits
    assert works[0]["id"] in await _square_ids(visitor)
    assert works[1]["id"] not in await _square_ids(visitor)  # never published
    assert await redis.zscore(PURGE_QUEUE, me["id"]) is None
    assert await redis.hget(account_key(me["id"]), "deleting") is None
    # an ordinary sign-in says restored: false
    again = await studio()
    response = await again.post("/api/auth/code", json={"email": email})
    response = await again.post(
        "/api/auth/verify",
        json={"email": email, "code": latest_code(mail_server, email)},
    )
    assert (await response.json())["restored"] is False
    # the operator restores the same way
    status, _ = await _delete(again, await _code_for(again, mail_server, email))
    assert status == 202
    environ = studio_environ(**studio_env, STUDIO_SECRET_KEY=TEST_SECRET)
    done = await studio_command("account", "restore", email, environ=environ)
    assert done.returncode == 0, done.stderr
    assert works[0]["id"] in await _square_ids(visitor)
    done = await studio_command("account", "restore", email, environ=environ)
    assert done.returncode == 1
    assert "not being deleted" in done.stderr


async def _account_world(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> dict[str, Any]:
    """An account with everything §9 lists, and two others it is entangled with."""
    doomed, friend, third = await studio(), await studio(), await studio()
    email = new_address()
    me = await sign_in(doomed, mail_server, email)
    other = await sign_in(friend, mail_server)
    await sign_in(third, mail_server)
    mine = await make_works(redis, tmp_path, me["id"], 2)
    theirs = await make_works(redis, tmp_path, other["id"], 1)
    await _publish(doomed, mine)
    await _publish(friend, theirs)
    # the friend favorites my work; I and a third person favorite the friend's
    assert (await friend.put(f"/api/works/{mine[0]['id']}/favorite")).status == 204
    for client in (doomed, third):
        response = await client.put(f"/api/works/{theirs[0]['id']}/favorite")
        assert response.status == 204
    upload = await doomed.post("/api/uploads", data=_png())
    assert upload.status == 201, await upload.text()
    # a collection holding a work, and today's daily credits (CONTRACT §12)
    made = await doomed.post("/api/collections", json={"name": "夜"})
    box = (await made.json())["id"]
    assert (
        await doomed.put(f"/api/collections/{box}/works/{mine[1]['id']}")
    ).status == 204
    assert (await doomed.post("/api/credits/daily")).status == 200
    order, _ = await OrderStore(redis, order_minutes=15, expire_months=24).create(
        me["id"], P30, "alipay", "desktop"
    )
    store = OrderStore(redis, order_minutes=15, expire_months=24)
    assert await store.pay(order["id"], "T" + order["id"], P30.fen)
    code = await _code_for(doomed, mail_server, email)
    return {
        "doomed": doomed, "friend": friend, "third": third, "email": email,
        "me": me, "other": other, "mine": mine, "theirs": theirs,
        "order": order["id"], "code": code,
        "upload": (await upload.json())["media_url"].rsplit("/", 1)[1],
    }  # fmt: skip


async def _values(redis: Redis, key: str) -> list[bytes]:
    """Read whatever a key holds as a list of byte strings (streams: nothing)."""
    kind = await redis.type(key)
    reply: Any = []
    if kind == b"string":
        reply = [await redis.get(key) or b""]
    elif kind == b"hash":
        flat = await redis.hgetall(key)
        reply = [*flat.keys(), *flat.values()]
    elif kind == b"set":
        reply = await redis.smembers(key)
    elif kind == b"zset":
        reply = await redis.zrange(key, 0, -1)
    elif kind == b"list":
        reply = await redis.lrange(key, 0, -1)
    return list(reply)


_BUCKETS = "studio:rl:"


async def _text_keys(redis: Redis) -> list[str]:
    return sorted([key.decode() async for key in redis.scan_iter(count=1000)])


async def _snapshot(redis: Redis) -> dict[str, tuple[bytes | None, int]]:
    """Every key but the rate-limit buckets: its serialized value and its PTTL."""
    keys = [key for key in await _text_keys(redis) if not key.startswith(_BUCKETS)]
    async with redis.pipeline(transaction=False) as pipe:
        for key in keys:
            pipe.dump(key)
            pipe.pttl(key)
        replies = await pipe.execute()
    return {
        key: (replies[2 * i], int(replies[2 * i + 1])) for i, key in enumerate(keys)
    }


def _assert_unchanged(
    before: dict[str, tuple[bytes | None, int]],
    after: dict[str, tuple[bytes | None, int]],
    elapsed_ms: float,
) -> None:
    """The same keys, values byte for byte, lifetimes shorter by the time passed."""
    assert set(after) == set(before)
    for key, (value, ttl) in after.items():
        kept, kept_ttl = before[key]
        assert value == kept, key
        if kept_ttl < 0:  # -1: no expiry, and it stays so
            assert ttl == kept_ttl, key
        else:
            assert kept_ttl - elapsed_ms - 5 <= ttl <= kept_ttl, (key, kept_ttl, ttl)


async def _assert_purged(
    world: dict[str, Any], redis: Redis, tmp_path: Path, visitor: Client
) -> None:
    """Nothing of the account is left but its order, its order's entry, the hash."""
    me, account = world["me"]["id"], account_key(world["me"]["id"])
    allowed = {
        f"{account}:orders",
        f"{account}:order:{world['order']}",
        f"{account}:ledger",
    }
    everything = await _text_keys(redis)
    mentioning = {key for key in everything if me in key}
    # the global set of open orders names the order (its id starts with mine)
    mentioning.discard("studio:orders:open")
    assert mentioning == allowed
    for key in allowed:
        assert KEPT_SECONDS - 60 < await redis.ttl(key) <= KEPT_SECONDS
    entries = [
        json.loads(raw) for raw in await redis.lrange(f"{account}:ledger", 0, -1)
    ]
    assert [(e["kind"], e["order_id"]) for e in entries] == [
        ("purchase", world["order"])
    ]
    order = f"{account}:order:{world['order']}"
    assert await redis.hget(order, "status") == b"paid"
    assert world["email"].encode() not in b" ".join(await _values(redis, order))
    # no value anywhere names me, my address or my works (but the kept records)
    wids = [w["id"] for w in world["mine"]]
    for key in everything:
        if key in allowed or key == "studio:orders:open":
            continue
        values = await _values(redis, key)
        blob = b" ".join(values)
        assert me.encode() not in blob, key
        assert world["email"].encode() not in blob, key
        if ":top" in key and ":e" in key.rsplit(":", 1)[-1]:
            continue  # a `top` snapshot: read pages skip what is gone, 10 min
        for wid in wids:
            assert wid.encode() not in blob, key
    hashed = address_key(world["email"], TEST_SECRET)
    assert await redis.ttl(trial_key(hashed)) > KEPT_SECONDS - 60
    # the keyed hash of my address: only that mark, short-lived rate limits and
    # the outcome of my last code check, kept a minute for its retry (codes.py)
    short_lived = ("studio:rl:", "studio:codecall:")
    for key in everything:
        if hashed in key:
            assert key == trial_key(hashed) or key.startswith(short_lived), key
            if key.startswith("studio:codecall:"):
                assert 0 < await redis.ttl(key) <= 60
    # no media of mine in the store; the friend's are there
    files = {p.name for p in (tmp_path / "media").rglob("*") if p.is_file()}
    for work in world["mine"]:
        assert Path(work["media_key"]).name not in files
        assert Path(work["thumb_key"]).name not in files
    assert world["upload"] not in files
    assert Path(world["theirs"][0]["media_key"]).name in files
    # the friend's work lost exactly my favorite; its fans' lists lost my work
    theirs = world["theirs"][0]["id"]
    response = await visitor.get(f"/api/square/{theirs}")
    assert (await response.json())["favorites"] == 1
    owned = await world["friend"].get(f"/api/works/{theirs}")
    assert (await owned.json())["favorites"] == 1
    favorites = await (await world["friend"].get("/api/favorites")).json()
    assert favorites["items"] == []


async def test_the_purge_after_the_grace_period_leaves_only_the_kept_records(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
    studio_env: Env,
) -> None:
    """A worker purges: no key, value or file of the account but its order's."""
    env = {**studio_env, "STUDIO_ACCOUNT_GRACE_DAYS": "0"}
    world = await _account_world(
        lambda: studio(STUDIO_ACCOUNT_GRACE_DAYS="0"), mail_server, redis, tmp_path
    )
    # another browser's sign-in code for the address is live when the purge comes
    response = await (await studio()).post(
        "/api/auth/code", json={"email": world["email"]}
    )
    assert response.status == 200
    me = world["me"]["id"]
    workers = {
        **env,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_ACCOUNT_PURGE_SECONDS": "0.2",
    }
    with worker_process(workers):
        # an export the worker builds: a ZIP of mine in the media store
        response = await world["doomed"].post("/api/account/export")
        assert response.status == 202, await response.text()
        path = f"/api/account/exports/{(await response.json())['id']}"
        deadline = time.monotonic() + 30
        while (await (await world["doomed"].get(path)).json())["status"] != "ready":
            assert time.monotonic() < deadline, "the export was not built"
            await asyncio.sleep(0.1)
        assert list((tmp_path / "media" / "exports").iterdir())
        status, _ = await _delete(world["doomed"], world["code"])
        assert status == 202
        while await redis.exists(account_key(me)) or await redis.zscore(
            PURGE_QUEUE, me
        ):
            assert time.monotonic() < deadline, "the worker did not purge"
            await asyncio.sleep(0.1)
    assert not list((tmp_path / "media" / "exports").iterdir())
    visitor = await studio()
    await _assert_purged(world, redis, tmp_path, visitor)
    # purging again changes nothing (rate-limit buckets expire on their own clock)
    started = time.monotonic()
    before = await _snapshot(redis)
    await visitor.app[DELETIONS].purge(me)
    after, elapsed_ms = await _snapshot(redis), (time.monotonic() - started) * 1000
    _assert_unchanged(before, after, elapsed_ms)
    # a new sign-in with the address opens a new account, without trial credits
    again = await studio()
    await again.post("/api/auth/code", json={"email": world["email"]})
    response = await again.post(
        "/api/auth/verify",
        json={
            "email": world["email"],
            "code": latest_code(mail_server, world["email"]),
        },
    )
    body = await response.json()
    assert body["new_account"] is True
    assert body["restored"] is False
    assert body["user"]["id"] != me
    assert body["user"]["credits"] == 0
    assert (await _credits(again))["lots"] == []


async def test_a_purge_cut_short_or_run_twice_at_once_ends_the_same(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """Killed after its first steps, then two purgers at once: the same end state."""
    world = await _account_world(studio, mail_server, redis, tmp_path)
    status, _ = await _delete(world["doomed"], world["code"])
    assert status == 202
    me = world["me"]["id"]
    store = world["doomed"].app[DELETIONS]
    later = time.time() + 8 * 86400
    # the first steps of a purge, as a worker killed right after them leaves it
    await store._run(me, "begin_purge", int(later))
    await store._drop_favorites(me)
    await store._drop_works(me)
    assert await redis.exists(account_key(me))
    # a restore loses to a purge that began
    again = await studio()
    await again.post("/api/auth/code", json={"email": world["email"]})
    response = await again.post(
        "/api/auth/verify",
        json={
            "email": world["email"],
            "code": latest_code(mail_server, world["email"]),
        },
    )
    body = await response.json()
    assert (body["restored"], body["new_account"]) == (False, True)
    assert body["user"]["credits"] == 0
    # the next passes: two workers at once
    settings = world["friend"].app[SETTINGS]
    elsewhere = DeletionStore.build(redis, settings, DirectoryStore(tmp_path / "media"))
    one, two = Purger(store, every=60), Purger(elsewhere, every=60)
    await asyncio.gather(one.pass_once(later), two.pass_once(later))
    # the new account of the address is not touched by the old one's purge
    new_id = body["user"]["id"]
    assert await redis.exists(account_key(new_id))
    assert (await again.get("/api/me")).status == 200
    # out of the way of the key checks: the new account and its filing
    await store.accounts.detach(world["email"], new_id)
    await redis.delete(account_key(new_id))
    async for key in redis.scan_iter(f"studio:*{new_id}*"):
        await redis.delete(key)
    await _assert_purged(world, redis, tmp_path, await studio())


async def test_the_operator_exports_deletes_and_purges_at_once(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
    studio_env: Env,
) -> None:
    """`studio account export|delete [--now]`, with a line each, as operators run it."""
    client = await studio()
    email = new_address()
    me = await sign_in(client, mail_server, email)
    await make_works(redis, tmp_path, me["id"], 1)
    environ = studio_environ(**studio_env, STUDIO_SECRET_KEY=TEST_SECRET)
    out = tmp_path / "mine.zip"
    done = await studio_command(
        "account", "export", email, "--out", str(out), environ=environ
    )
    assert done.returncode == 0, done.stderr
    with zipfile.ZipFile(out) as archive:
        account = json.loads(archive.read("account.json"))
    assert email in json.dumps(account)
    done = await studio_command("account", "delete", email, environ=environ)
    assert done.returncode == 0, done.stderr
    assert "purged at" in done.stdout
    assert await redis.zscore(PURGE_QUEUE, me["id"]) is not None
    done = await studio_command("account", "delete", email, "--now", environ=environ)
    assert done.returncode == 0, done.stderr
    assert not await redis.exists(account_key(me["id"]))
    assert await redis.zscore(PURGE_QUEUE, me["id"]) is None
    done = await studio_command("account", "delete", email, environ=environ)
    assert done.returncode == 1
    assert "no account" in done.stderr


async def test_on_a_cluster_the_purge_finds_the_keys_on_the_accounts_node(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    cluster: Cluster,
    tmp_path: Path,
) -> None:
    """SCAN on the account slot's master only; nothing of the account is left."""
    settings = make_settings(
        STUDIO_REDIS_URL=cluster.url,
        STUDIO_MEDIA_DIR=str(tmp_path / "media"),
        STUDIO_ACCOUNT_GRACE_DAYS="0",
        **CODES_AT_WILL,
    )
    client = await aiohttp_client(create_app(settings))
    email = new_address()
    me = await sign_in(client, mail_server, email)
    redis = connect(cluster.url, cluster=True, socket_timeout=2, connect_timeout=1)
    try:
        works = await make_works(redis, tmp_path, me["id"], 2)
        await _publish(client, works)
        upload = await client.post("/api/uploads", data=_png())
        assert upload.status == 201
        status, _ = await _delete(client, await _code_for(client, mail_server, email))
        assert status == 202
        assert await client.app[DELETIONS].purge(me["id"])
        left = [key async for key in redis.scan_iter(f"*{me['id']}*")]
        assert left == []
        assert not [p for p in (tmp_path / "media").rglob("*") if p.is_file()]
    finally:
        await redis.aclose()


async def test_a_payment_arriving_after_the_purge_brings_no_account_back(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """The order stays as a record; crediting, refunding and quoting it stop there."""
    client = await studio()
    me = await sign_in(client, mail_server)
    orders = OrderStore(redis, order_minutes=15, expire_months=24)
    order, _ = await orders.create(me["id"], P30, "alipay", "desktop")
    paid, _ = await orders.create(me["id"], P30, "alipay", "desktop")
    assert await orders.pay(paid["id"], "T1", P30.fen)
    deletions = client.app[DELETIONS]
    await deletions.delete(me["id"], purge_at=int(time.time()))
    assert await deletions.purge(me["id"])
    with pytest.raises(UnknownAccount):
        await orders.pay(order["id"], "T2", P30.fen)
    assert await orders.provider_refunded(paid["id"], P30.fen) == 0
    with pytest.raises(NotRefundable, match="ACCOUNT_GONE"):
        await orders.begin_refund(paid["id"], time.time())
    assert not await redis.exists(account_key(me["id"]))
    kept = await orders.get(paid["id"])
    assert kept is not None
    assert kept["status"] == "paid"
