"""Export my data (CONTRACT §9): a ZIP built by real workers, for its owner only."""

from __future__ import annotations

import asyncio
import datetime as dt
import errno
import hashlib
import io
import json
import os
import signal
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.account.exports import QUEUE, ExportStore, ExportTooSoon
from service.app import create_app
from service.content import load_content
from service.payments.orders import OrderStore, packs_of
from service.store.embedded import MailCatcher, RedisServer
from service.studio.ledger import Ledger, text
from service.studio.media.store import DirectoryStore, new_key

from .chaos import late_replies
from .cluster import Cluster
from .conftest import Client, Env, SettingsFactory, forget_limits
from .raw_http import exchange
from .workbench import sign_in, worker_process

JSON_FILES = {
    "account.json",
    "collections.json",
    "credits.json",
    "orders.json",
    "generations.json",
    "works.json",
    "favorites.json",
    "sessions.json",
}
MIB = 1024 * 1024


@pytest.fixture
def studio_env(tmp_path: Path, redis_server: RedisServer) -> Env:
    """Settings the app and its workers share: demo upstream, one media directory."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_JOBS_VISIBILITY_TIMEOUT": "2",
    }


@pytest.fixture
async def studio(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    redis: Redis,
) -> Client:
    """The real app from the factory, on an empty database, with those settings."""
    return await aiohttp_client(create_app(make_settings(**studio_env)))


@dataclass(frozen=True)
class Person:
    """A signed-in account and the cookie its requests carry."""

    id: str
    email: str
    token: str

    @property
    def cookie(self) -> dict[str, str]:
        """Return the header that makes a request this person's."""
        return {"Cookie": f"studio_session={self.token}"}


async def person(client: Client, mail_server: MailCatcher) -> Person:
    """Sign someone new in; later requests name them by their cookie alone."""
    user = await sign_in(client, mail_server)
    jar = client.session.cookie_jar
    token = jar.filter_cookies(client.make_url("/"))["studio_session"].value
    jar.clear()
    return Person(user["id"], user["email"], token)


def _png(shade: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (shade, 90, 200)).save(buffer, "PNG")
    return buffer.getvalue()


async def _json(client: Client, method: str, path: str, who: Person, **kw: Any) -> Any:
    response = await client.request(method, path, headers=who.cookie, **kw)
    assert response.status < 300, (path, response.status, await response.text())
    return await response.json() if response.status != 204 else None


async def _upload(client: Client, who: Person, data: bytes) -> str:
    form = aiohttp.FormData()
    form.add_field("file", data, filename="a.png", content_type="image/png")
    body = await _json(client, "POST", "/api/uploads", who, data=form)
    return str(body["id"])


async def _generate(client: Client, who: Person, count: int) -> dict[str, Any]:
    body = {"model": "seedream-4", "prompt": f"a lamp for {who.id}", "count": count}
    generation = await _json(client, "POST", "/api/generations", who, json=body)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = await _json(client, "GET", f"/api/generations/{generation['id']}", who)
        if done["status"] == "succeeded":
            return dict(done)
        await asyncio.sleep(0.05)
    raise AssertionError("the generation never succeeded")


async def _buy(redis: Redis, who: Person, trade_no: str) -> str:
    """An order paid at its provider, through the real order store."""
    orders = OrderStore(redis, order_minutes=15, expire_months=24)
    pack = packs_of(load_content())[0]
    order, _ = await orders.create(who.id, pack, "alipay", "desktop")
    assert await orders.pay(order["id"], trade_no, pack.fen)
    return order["id"]


async def _until_ready(
    client: Client, who: Person, eid: str, within: float = 60
) -> dict[str, Any]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        body = await _json(client, "GET", f"/api/account/exports/{eid}", who)
        if body["status"] != "pending":
            assert body["status"] == "ready", body
            return dict(body)
        await asyncio.sleep(0.1)
    raise AssertionError(f"export {eid} stayed pending")


async def _download(client: Client, who: Person, eid: str, target: Path) -> None:
    """Stream the ZIP to a file, checking the headers a private download needs."""
    async with client.get(
        f"/api/account/exports/{eid}/file", headers=who.cookie
    ) as response:
        assert response.status == 200, await response.text()
        assert response.headers["Content-Type"] == "application/zip"
        assert response.headers["Cache-Control"] == "private, no-store"
        assert response.headers["Content-Disposition"].startswith("attachment;")
        with target.open("wb") as file:
            async for chunk in response.content.iter_chunked(MIB):
                file.write(chunk)


def _vm_hwm(pid: int) -> int:
    """Read a process's peak resident memory (bytes) from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def _without_files(work: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in work.items() if k not in ("media_file", "thumb_file")}


async def test_the_zip_holds_exactly_my_data_and_the_originals_bytes(
    studio: Client,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """Everything of mine, in files that parse; nothing of another account's."""
    me, other = await person(studio, mail_server), await person(studio, mail_server)
    my_png, other_png = _png(10), _png(250)
    my_upload = await _upload(studio, me, my_png)
    other_upload = await _upload(studio, other, other_png)
    my_order = await _buy(redis, me, "2025TRADE-MINE")
    other_order = await _buy(redis, other, "2025TRADE-OTHER")
    events: list[dict[str, Any]] = []
    with worker_process(studio_env):
        mine = await _generate(studio, me, count=2)
        theirs = await _generate(studio, other, count=1)
        first, second = (work["id"] for work in mine["works"])
        (their_work,) = (work["id"] for work in theirs["works"])
        await _json(studio, "POST", f"/api/works/{first}/publish", me)
        await _json(studio, "POST", f"/api/works/{their_work}/publish", other)
        await _json(studio, "PUT", f"/api/works/{second}/favorite", me)
        await _json(studio, "PUT", f"/api/works/{their_work}/favorite", me)
        await _json(studio, "PUT", f"/api/works/{first}/favorite", other)
        await _json(studio, "POST", "/api/credits/daily", me)
        night = await _json(studio, "POST", "/api/collections", me, json={"name": "夜"})
        path = f"/api/collections/{night['id']}/works"
        for wid in (second, first):
            await studio.put(f"{path}/{wid}", headers=me.cookie)
        await _json(studio, "POST", "/api/collections", other, json={"name": "OTHERS"})

        opened = asyncio.Event()

        async def listen() -> None:
            async with studio.get("/api/events", headers=me.cookie) as response:
                name = ""
                async for raw in response.content:
                    line = raw.decode().rstrip("\r\n")
                    if line.startswith("event: "):
                        name = line[7:]
                    elif line.startswith("data: "):
                        opened.set()
                        if name == "export":
                            events.append(json.loads(line[6:]))
                            if events[-1]["status"] != "pending":
                                return

        listener = asyncio.create_task(listen())
        await asyncio.wait_for(opened.wait(), 10)
        response = await studio.post("/api/account/export", headers=me.cookie)
        assert response.status == 202, await response.text()
        requested = await response.json()
        assert set(requested) == {"id", "status"}
        assert requested["status"] == "pending"
        eid = requested["id"]
        await asyncio.wait_for(listener, 60)
        ready = await _until_ready(studio, me, eid)
        archive = tmp_path / "mine.zip"
        await _download(studio, me, eid, archive)

    # The stream saw it become ready, in the shape GET answers.
    assert [event["status"] for event in events] == ["pending", "ready"]
    assert events[-1] == ready
    assert ready["download_url"] == f"/api/account/exports/{eid}/file"
    assert ready["expires_at"] > ready["created_at"]

    with zipfile.ZipFile(archive) as zipped:
        assert zipped.testzip() is None
        raw = {name: zipped.read(name) for name in zipped.namelist()}
    parsed = {name: json.loads(raw[name]) for name in JSON_FILES}
    my_media = {
        f"media/{key}"
        for work in parsed["works.json"]["works"]
        for key in (work["media_file"][6:], work["thumb_file"][6:])
    }
    (upload,) = parsed["account.json"]["uploads"]
    assert set(raw) == JSON_FILES | {"README.txt", upload["file"]} | my_media
    assert len(my_media) == 4

    account = parsed["account.json"]
    me_now = await _json(studio, "GET", "/api/me", me)
    assert (account["id"], account["email"]) == (me.id, me.email)
    assert account["created_at"] == me_now["created_at"]
    assert account["balance"] == me_now["credits"]
    assert account["credits_owed"] == 0
    assert upload["id"] == my_upload
    assert raw[upload["file"]] == my_png

    credits = await _json(studio, "GET", "/api/credits?limit=50", me)
    assert parsed["credits.json"]["balance"] == credits["balance"]
    assert parsed["credits.json"]["entries"] == credits["entries"]
    live = [lot for lot in parsed["credits.json"]["lots"] if lot["remaining"] > 0]
    assert sorted(live, key=lambda lot: lot["id"]) == sorted(
        credits["lots"], key=lambda lot: lot["id"]
    )

    (order,) = parsed["orders.json"]["orders"]
    api_orders = await _json(studio, "GET", "/api/orders", me)
    assert {k: v for k, v in order.items() if k not in ("trade_no", "refunds")} == (
        api_orders["items"][0]
    )
    assert (order["id"], order["trade_no"], order["refunds"]) == (
        my_order,
        "2025TRADE-MINE",
        [],
    )

    generations = await _json(studio, "GET", "/api/generations", me)
    (generation,) = parsed["generations.json"]["generations"]
    generation["works"] = [_without_files(work) for work in generation["works"]]
    assert [generation] == generations["items"]

    works = parsed["works.json"]["works"]
    assert [_without_files(work) for work in works] == (
        await _json(studio, "GET", "/api/works", me)
    )["items"]
    by_id = {work["id"]: work for work in works}
    assert by_id[first]["published_at"] is not None
    assert (by_id[first]["favorites"], by_id[first]["favorite"]) == (1, False)
    assert (by_id[second]["favorites"], by_id[second]["favorite"]) == (1, True)
    for work in works:  # the same bytes /media/ serves
        served = await studio.get(work["media_url"])
        assert await served.read() == raw[work["media_file"]]
        thumb = await studio.get(work["thumb_url"])
        assert await thumb.read() == raw[work["thumb_file"]]

    favorites = parsed["favorites.json"]["favorites"]
    assert [f["id"] for f in favorites] == [their_work, second]
    assert all(f["favorited_at"].endswith("Z") for f in favorites)

    collections = await _json(studio, "GET", "/api/collections", me)
    (collection,) = parsed["collections.json"]["collections"]
    assert collection == {**collections["collections"][0], "works": [first, second]}
    assert b"OTHERS" not in raw["collections.json"]
    beijing = dt.datetime.now(dt.UTC) + dt.timedelta(hours=8)
    assert account["daily_claimed_on"] == beijing.date().isoformat()
    daily = [e for e in credits["entries"] if e["note"] == "daily credits"]
    assert [e["kind"] for e in daily] == ["grant"]

    (session,) = parsed["sessions.json"]["sessions"]
    assert set(session) == {"created_at", "last_seen_at"}
    secrets = (me.token, hashlib.sha256(me.token.encode()).hexdigest())
    # Nothing of the other account, save the id of the work I favorited.
    theirs_only = [
        other.id,
        other.email,
        other.token,
        theirs["id"],
        other_upload,
        other_order,
        "2025TRADE-OTHER",
    ]
    for name, data in raw.items():
        for secret in secrets:
            assert secret.encode() not in data, name
        for marker in theirs_only:
            assert marker.encode() not in data, (name, marker)
        if name != "favorites.json":
            assert their_work.encode() not in data, name
    assert other_png not in raw.values()

    readme = raw["README.txt"].decode()
    assert readme.index("中文") < readme.index("English")
    for name in JSON_FILES:
        assert readme.count(name) >= 2  # described in both languages
    assert "/privacy" in readme


async def test_only_the_owner_sees_and_downloads_an_export_and_never_via_media(
    studio: Client,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """Another account's session gets 404; /media/ refuses the key; expiry ends it."""
    me, other = await person(studio, mail_server), await person(studio, mail_server)
    with worker_process(studio_env):
        eid = (await _json(studio, "POST", "/api/account/export", me))["id"]
        await _until_ready(studio, me, eid)
        record = f"studio:acct:{{{me.id}}}:export:{eid}"
        key = text(await redis.hget(record, "key") or b"")
        stored = DirectoryStore(Path(studio_env["STUDIO_MEDIA_DIR"])).path(key)
        assert key.startswith("exports/")
        assert stored.is_file()

        # HEAD: the download's headers and no body, the connection still good.
        cookie = me.cookie["Cookie"].encode()
        answer = await exchange(
            studio.make_url("/"),
            f"HEAD /api/account/exports/{eid}/file HTTP/1.1\r\nHost: x\r\n".encode()
            + b"Cookie: " + cookie + b"\r\n\r\n"
            + b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        )  # fmt: skip
        head, _, rest = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK\r\n")
        assert b"Content-Type: application/zip" in head
        assert rest.startswith(b"HTTP/1.1 200 OK\r\n"), rest[:40]

        for path in (f"/api/account/exports/{eid}", f"/api/account/exports/{eid}/file"):
            response = await studio.get(path, headers=other.cookie)
            assert (response.status, await response.json()) == (
                404,
                {"error": "NOT_FOUND"},
            )
            response = await studio.get(path)
            assert (response.status, await response.json()) == (
                401,
                {"error": "NO_SESSION"},
            )
        for path in (f"/media/{key}", f"/media/{quote(key, safe='')}"):
            assert (await studio.get(path)).status == 404
        for bad in ("0" * 24, "zz", "A" * 24, eid + "0"):
            response = await studio.get(
                f"/api/account/exports/{bad}", headers=me.cookie
            )
            assert response.status == 404

        # Past its 24 hours: 404 at once, and a worker deletes the file.
        await redis.hset(record, "expires", int(time.time()) - 1)
        await redis.zadd("studio:exports:{jobs}:expiring", {key: time.time() - 1})
        response = await studio.get(
            f"/api/account/exports/{eid}/file", headers=me.cookie
        )
        assert response.status == 404
        assert (
            await studio.get(f"/api/account/exports/{eid}", headers=me.cookie)
        ).status == 404
        for _ in range(100):
            if not stored.exists():
                break
            await asyncio.sleep(0.1)
        assert not stored.exists()


async def test_one_export_a_day_and_none_while_the_account_is_deleting(
    studio: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """The limiter refuses a second export; so does the pending one, limits aside."""
    me, other = await person(studio, mail_server), await person(studio, mail_server)
    response = await studio.post("/api/account/export", headers=me.cookie)
    assert response.status == 202
    assert "export" in response.headers["RateLimit-Policy"]
    eid = (await response.json())["id"]
    status = await _json(studio, "GET", f"/api/account/exports/{eid}", me)
    assert status == {
        "id": eid,
        "status": "pending",
        "created_at": status["created_at"],
        "expires_at": None,
        "download_url": None,
    }

    response = await studio.post("/api/account/export", headers=me.cookie)
    assert response.status == 429
    assert response.headers["Content-Type"].startswith("application/problem+json")
    body = await response.json()
    assert body["error"] == "RATE_LIMITED"
    assert 86000 < int(response.headers["Retry-After"]) <= 86400
    assert body["retry_after"] == int(response.headers["Retry-After"])
    assert "RateLimit" in response.headers

    await forget_limits(redis)  # the pending export still stands
    response = await studio.post("/api/account/export", headers=me.cookie)
    assert response.status == 429
    assert (await response.json())["error"] == "RATE_LIMITED"
    assert 86000 < int(response.headers["Retry-After"]) <= 86400

    # An account being deleted exports nothing, and is not charged for asking.
    await redis.hset(f"studio:acct:{{{other.id}}}", "deleting", int(time.time()))
    response = await studio.post("/api/account/export", headers=other.cookie)
    assert (response.status, await response.json()) == (
        409,
        {"error": "ACCOUNT_DELETING"},
    )
    await redis.hdel(f"studio:acct:{{{other.id}}}", "deleting")
    response = await studio.post("/api/account/export", headers=other.cookie)
    assert response.status == 202


def _library() -> Iterator[tuple[str, bytes]]:
    """50 MiB of random files: two large ones (a whole one in memory would show)."""
    for size in (20, 20, 4, 2, 2, 1, 1):
        yield new_key("png"), os.urandom(size * MIB)


async def _record_uploads(
    redis: Redis, media: DirectoryStore, who: Person, files: dict[str, bytes]
) -> None:
    """Put files straight into the media store and the account's upload records."""
    for number, (key, data) in enumerate(files.items()):
        await media.put(key, data)
        await redis.hset(
            f"studio:acct:{{{who.id}}}:upload:big{number:04d}",
            mapping={"key": key, "content_type": "image/png", "width": 1, "height": 1},
        )


async def test_a_fifty_megabyte_library_exports_with_the_workers_memory_flat(
    studio: Client,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """Media stream through in chunks: the worker's peak memory barely moves."""
    media = DirectoryStore(Path(studio_env["STUDIO_MEDIA_DIR"]))
    warm, me = await person(studio, mail_server), await person(studio, mail_server)
    digests = {}
    files = dict(_library())
    for key, data in files.items():
        digests[f"media/{key}"] = hashlib.sha256(data).hexdigest()
    await _record_uploads(redis, media, me, files)
    del files
    with worker_process(studio_env) as worker:
        # A small export first: the code path, its threads and modules warmed up.
        eid = (await _json(studio, "POST", "/api/account/export", warm))["id"]
        await _until_ready(studio, warm, eid)
        before = _vm_hwm(worker.pid)
        eid = (await _json(studio, "POST", "/api/account/export", me))["id"]
        await _until_ready(studio, me, eid, within=120)
        after = _vm_hwm(worker.pid)
    archive = tmp_path / "big.zip"
    await _download(studio, me, eid, archive)
    assert archive.stat().st_size > 50 * 10**6
    print(f"worker VmHWM {before / MIB:.1f} MiB -> {after / MIB:.1f} MiB")
    assert after - before < 15 * MIB
    with zipfile.ZipFile(archive) as zipped:
        for name, digest in digests.items():
            hasher = hashlib.sha256()
            with zipped.open(name) as member:
                while chunk := member.read(MIB):
                    hasher.update(chunk)
            assert hasher.hexdigest() == digest, name


def _feed_fifo(path: Path, data: bytes, within: float) -> None:
    """Write into a FIFO once a reader opened it (fails if none does in time)."""
    deadline = time.monotonic() + within
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            break
        except OSError as err:
            if err.errno != errno.ENXIO or time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    os.set_blocking(fd, True)
    with os.fdopen(fd, "wb") as pipe:
        pipe.write(data)


async def test_a_worker_killed_mid_export_leaves_it_to_another(
    studio: Client,
    mail_server: MailCatcher,
    studio_env: Env,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """SIGKILL while the ZIP is half written: another worker builds it, once."""
    media = DirectoryStore(Path(studio_env["STUDIO_MEDIA_DIR"]))
    me = await person(studio, mail_server)
    # A media file that is a FIFO holds the build at that file until fed.
    held = new_key("png")
    await _record_uploads(redis, media, me, {held: b""})
    media.path(held).unlink()
    os.mkfifo(media.path(held))
    record = f"studio:acct:{{{me.id}}}:export:"
    with worker_process(studio_env) as first:
        eid = (await _json(studio, "POST", "/api/account/export", me))["id"]
        record += eid
        deadline = time.monotonic() + 20
        while not await redis.hget(record, "builder"):
            assert time.monotonic() < deadline, "no worker started the export"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # it is now waiting at the held file
        first_builder = await redis.hget(record, "builder")
        assert await redis.hget(record, "status") == b"pending"
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    killed_at = time.monotonic()
    payload = os.urandom(300_000)
    with worker_process(studio_env) as second:
        await asyncio.to_thread(_feed_fifo, media.path(held), payload, 30)
        ready = await _until_ready(studio, me, eid)
        assert second.poll() is None
    assert time.monotonic() - killed_at < 2 + 15
    assert await redis.hget(record, "builder") != first_builder
    assert ready["status"] == "ready"
    archive = tmp_path / "taken-over.zip"
    await _download(studio, me, eid, archive)
    with zipfile.ZipFile(archive) as zipped:
        assert zipped.read(f"media/{held}") == payload
    exports = list((media.root / "exports").iterdir())
    assert len(exports) == 1  # built once: nothing of the killed run was kept


async def test_make_runs_embedded_worker_builds_exports_too(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
) -> None:
    """The dev process's own worker takes export jobs like a `studio worker`."""
    settings = make_settings(**studio_env)
    client = await aiohttp_client(create_app(settings, embedded_worker=True))
    me = await person(client, mail_server)
    eid = (await _json(client, "POST", "/api/account/export", me))["id"]
    await _until_ready(client, me, eid, within=20)
    archive = tmp_path / "embedded.zip"
    await _download(client, me, eid, archive)
    with zipfile.ZipFile(archive) as zipped:
        account = json.loads(zipped.read("account.json"))
    assert account["id"] == me.id


async def test_an_export_is_built_and_served_on_redis_cluster(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    cluster: Cluster,
    mail_server: MailCatcher,
    tmp_path: Path,
) -> None:
    """Every key has its owner's hash tag (or the jobs' own): it runs on a cluster."""
    settings = make_settings(**{**studio_env, "STUDIO_REDIS_URL": cluster.url})
    assert settings.redis_cluster
    client = await aiohttp_client(create_app(settings, embedded_worker=True))
    me = await person(client, mail_server)
    png = _png(77)
    upload = await _upload(client, me, png)
    eid = (await _json(client, "POST", "/api/account/export", me))["id"]
    await _until_ready(client, me, eid, within=30)
    archive = tmp_path / "cluster.zip"
    await _download(client, me, eid, archive)
    with zipfile.ZipFile(archive) as zipped:
        account = json.loads(zipped.read("account.json"))
        (uploaded,) = account["uploads"]
        assert uploaded["id"] == upload
        assert zipped.read(uploaded["file"]) == png
        sessions = json.loads(zipped.read("sessions.json"))["sessions"]
    assert account["id"] == me.id
    assert len(sessions) == 1
    response = await client.post("/api/account/export", headers=me.cookie)
    assert response.status == 429


async def test_a_request_retried_after_its_reply_was_lost_is_answered_and_queued(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The first try recorded the export; the retry answers it (not TOO_SOON,
    which would leave it unqueued and refuse the person for a day)."""
    ledger = Ledger(redis, trial_credits=0, expire_months=24)
    for account in ("exp0", "exp1"):
        await ledger.open(account, f"{account}@example.com", account * 8)
    await ExportStore(redis).request("exp0")  # the script is loaded: tries run it
    async with late_replies(redis_server.port) as (slow, late):
        fields = await late(ExportStore(slow).request("exp1"), marker=b"request")
    assert fields["status"] == "pending"
    assert await redis.zcard("studio:acct:{exp1}:exports") == 1
    assert await redis.zscore(QUEUE, f"exp1/{fields['id']}") is not None
    with pytest.raises(ExportTooSoon):  # a new request within the day is refused
        await ExportStore(redis).request("exp1")
