"""Complaints: anyone reports a square work; an operator keeps, removes or suspends."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from service.moderation.log import ModerationLog
from service.square.feed import SquareStore
from service.store.embedded import MailCatcher, RedisServer
from service.studio.ledger import Ledger
from service.studio.media.pending import PENDING, PendingMedia
from service.studio.media.store import DirectoryStore
from service.studio.takedown import withdraw_files
from service.studio.works import WorkStore

from .conftest import TEST_SECRET, Client, MakeClient, forget_limits
from .processes import studio_environ
from .test_library import make_works
from .workbench import Finished, new_address, sign_in, studio_command


async def _report(client: Client, wid: str, **body: Any) -> tuple[int, Any]:
    payload = {"reason": "shows a real person", "category": "privacy", **body}
    response = await client.post(f"/api/square/{wid}/report", json=payload)
    return response.status, await response.json()


async def _published(
    client: Client, redis: Redis, tmp_path: Path, account: str, count: int
) -> list[str]:
    works = await make_works(redis, tmp_path, account, count)
    for work in works:
        assert (await client.post(f"/api/works/{work['id']}/publish")).status == 200
    return [work["id"] for work in works]


def _operator(redis_server: RedisServer, media: Path) -> dict[str, str]:
    """The environment of an operator's command: the service's Redis and media."""
    return studio_environ(
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        STUDIO_MEDIA_DIR=str(media),
    )


async def _files(root: Path) -> list[str]:
    """Name every media file under a directory, read in a thread."""
    return await asyncio.to_thread(lambda: sorted(p.name for p in root.rglob("*.*")))


async def _square(client: Client) -> list[str]:
    body = await (await client.get("/api/square")).json()
    return [item["id"] for item in body["items"]]


async def test_a_visitor_reports_a_square_work_and_gets_an_id_at_once(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """202 {id, status: received}, no session needed; one log record; still listed."""
    author, visitor = await studio(), await studio()
    me = await sign_in(author, mail_server)
    (wid,) = await _published(author, redis, tmp_path, me["id"], 1)
    status, body = await _report(visitor, wid)
    assert status == 202
    assert body["status"] == "received"
    assert body["id"].isalnum()
    assert await _square(visitor) == [wid]  # decided by an operator, not by count
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["verdict"], record["work"], record["report"]) == (
        "report",
        "reported",
        wid,
        body["id"],
    )
    assert (record["account"], record["field"]) == (me["id"], "privacy")
    status, _ = await _report(author, wid, category="other")  # signed in: the same
    assert status == 202


async def test_bad_reports_name_their_field_and_a_missing_work_is_404(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """Fields first (400 with field), then the work (404 unless in the square)."""
    author, visitor = await studio(), await studio()
    me = await sign_in(author, mail_server)
    (wid,) = await _published(author, redis, tmp_path, me["id"], 1)
    (hidden,) = [w["id"] for w in await make_works(redis, tmp_path, me["id"], 1)]
    for body, field in (
        ({"reason": ""}, "reason"),
        ({"reason": "   "}, "reason"),
        ({"reason": "x" * 501}, "reason"),
        ({"reason": 5}, "reason"),
        ({"category": "spam"}, "category"),
        ({"category": None}, "category"),
        ({"category": {}}, "category"),
        ({"category": ["other"]}, "category"),
    ):
        assert await _report(visitor, wid, **body) == (
            400,
            {"error": "BAD_REQUEST", "field": field},
        )
    shapes: tuple[tuple[dict[str, object], str], ...] = (
        ({"reason": "x"}, "category"),  # missing
        ({"reason": "x", "category": "other", "extra": 1}, "extra"),  # unknown
    )
    for shape, field in shapes:
        response = await visitor.post(f"/api/square/{wid}/report", json=shape)
        assert (response.status, await response.json()) == (
            400,
            {"error": "BAD_REQUEST", "field": field},
        )
    for missing in (hidden, "nope", "a" * 65, "%2e%2e"):
        assert await _report(visitor, missing) == (404, {"error": "NOT_FOUND"})
    assert [r async for r in ModerationLog(redis, 180).read()] == []


async def test_reports_are_limited_per_address_like_the_square(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """The gallery policy's bucket: a flood from one address is refused with 429."""
    author = await studio()
    me = await sign_in(author, mail_server)
    (wid,) = await _published(author, redis, tmp_path, me["id"], 1)
    visitor = await studio(
        STUDIO_LIMITS_GALLERY_QUOTA="3",
        STUDIO_LIMITS_GALLERY_BURST="2",
        STUDIO_LIMITS_GALLERY_WINDOW="3600",
    )
    await forget_limits(redis)
    statuses = [(await _report(visitor, wid))[0] for _ in range(4)]
    assert statuses[:2] == [202, 202]
    assert statuses[-1] == 429


async def test_an_operator_works_the_queue_keep_remove_and_suspend(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """keep leaves it; remove takes it off for good; suspend suspends the author too."""
    author, visitor = await studio(), await studio()
    email = new_address()
    me = await sign_in(author, mail_server, email)
    kept, removed, last = await _published(author, redis, tmp_path, me["id"], 3)
    ids = {}
    for wid in (kept, removed, last):
        status, body = await _report(visitor, wid)
        assert status == 202
        ids[wid] = body["id"]
    # Not the app's media directory: see below.
    environ = _operator(redis_server, tmp_path / "elsewhere")

    async def reports(*args: str) -> Finished:
        return await studio_command("reports", *args, environ=environ)

    listed = await reports("list", "--open")
    queue = [json.loads(line) for line in listed.stdout.splitlines()]
    assert [item["id"] for item in queue] == [ids[kept], ids[removed], ids[last]]
    assert {item["status"] for item in queue} == {"open"}
    assert all(item["due_at"] > item["created_at"] for item in queue)

    done = await reports("resolve", ids[kept], "keep", "--note", "satire")
    assert done.returncode == 0, done.stderr
    # A command that cannot read the work's files takes it off the square and
    # says so; the report stays open until its files have moved (takedown.py).
    done = await reports("resolve", ids[removed], "remove")
    assert done.returncode == 1
    assert "could not be moved (MissingMedia" in done.stderr
    assert sorted(await _square(visitor)) == sorted([kept, last])
    first = (await (await author.get(f"/api/works/{removed}")).json())["removed_at"]
    environ["STUDIO_MEDIA_DIR"] = str(tmp_path / "media")
    await asyncio.sleep(1.1)  # a second run a second later keeps the first time
    done = await reports("resolve", ids[removed], "remove")
    assert done.returncode == 0, done.stderr
    assert (await reports("resolve", ids[removed], "keep")).returncode == 1
    assert (await reports("resolve", "nosuchreport", "keep")).returncode == 1
    assert sorted(await _square(visitor)) == sorted([kept, last])
    mine = await (await author.get(f"/api/works/{removed}")).json()
    assert mine["published_at"] is None
    assert mine["removed_at"] == first
    again = await author.post(f"/api/works/{removed}/publish")
    assert again.status == 409
    assert await again.json() == {"error": "WORK_REMOVED"}

    done = await reports("resolve", ids[last], "suspend", "--note", "repeated")
    assert done.returncode == 0, done.stderr
    assert await _square(visitor) == []
    assert (await author.get("/api/me")).status == 401
    assert (await reports("list", "--open")).stdout == ""
    everything = (await reports("list")).stdout.splitlines()
    assert [json.loads(line)["decision"] for line in everything] == [
        "keep",
        "remove",
        "suspend",
    ]
    log = [r async for r in ModerationLog(redis, 180).read()]
    assert [(r["source"], r["verdict"]) for r in log] == [
        ("report", "reported"),
        ("report", "reported"),
        ("report", "reported"),
        ("operator", "keep"),
        ("operator", "remove"),
        ("report", "suspended"),
        ("operator", "suspend"),
    ]


async def test_a_removed_works_urls_stop_answering_and_its_author_still_sees_it(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """The URLs the square gave out answer 404 once an operator removes the
    work; the author's library shows it under new ones, the same bytes; no
    file is left over and no note pending."""
    author, visitor = await studio(), await studio()
    me = await sign_in(author, mail_server, new_address())
    (wid,) = await _published(author, redis, tmp_path, me["id"], 1)
    before = await (await author.get(f"/api/works/{wid}")).json()
    urls = (before["media_url"], before["thumb_url"])
    for url in urls:
        assert (await visitor.get(url)).status == 200
    media = tmp_path / "media"
    files = await _files(media)
    status, report = await _report(visitor, wid)
    assert status == 202
    environ = _operator(redis_server, media)
    done = await studio_command(
        "reports", "resolve", report["id"], "remove", environ=environ
    )
    assert done.returncode == 0, done.stderr
    for url in urls:
        assert (await visitor.get(url)).status == 404, url
    after = await (await author.get(f"/api/works/{wid}")).json()
    assert after["removed_at"]
    moved = (after["media_url"], after["thumb_url"])
    assert not set(moved) & set(urls)
    bodies = [await (await author.get(url)).read() for url in moved]
    assert bodies == [b"data", b"thumb"]  # as make_works stored them
    now = await _files(media)
    assert len(now) == len(files)
    assert not set(now) & set(files)
    assert await redis.zcard(PENDING) == 0


async def test_withdrawing_a_work_that_is_gone_leaves_nothing(
    redis: Redis, tmp_path: Path
) -> None:
    """Deleted by its author meanwhile: no copy, no note."""
    media = DirectoryStore(tmp_path / "media")
    works = WorkStore(redis, SquareStore(redis))
    pending = PendingMedia(redis)
    assert not await withdraw_files(works, media, pending, "nobody", "gone")
    assert await _files(tmp_path) == []
    assert await redis.zcard(PENDING) == 0


async def test_a_reporter_reads_how_the_report_stands_by_its_id(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """received, then decided: kept or removed (a suspension reads as removed:
    nothing about the author); an id that is not a report's is a 404."""
    author, visitor = await studio(), await studio()
    me = await sign_in(author, mail_server, new_address())
    kept, removed = await _published(author, redis, tmp_path, me["id"], 2)
    ids = [(await _report(visitor, wid))[1]["id"] for wid in (kept, removed)]
    response = await visitor.get(f"/api/reports/{ids[0]}")
    assert response.status == 200
    assert response.headers["Cache-Control"] == "no-store"
    assert "RateLimit" in response.headers  # per address, as reporting is
    received = await response.json()
    assert received["status"] == "received"
    assert (received["outcome"], received["decided_at"]) == (None, None)
    assert received["due_at"] > received["created_at"]
    environ = _operator(redis_server, tmp_path / "media")
    for rid, decision in zip(ids, ("keep", "suspend"), strict=True):
        done = await studio_command(
            "reports", "resolve", rid, decision, environ=environ
        )
        assert done.returncode == 0, done.stderr
    for rid, outcome in zip(ids, ("kept", "removed"), strict=True):
        decided = await (await visitor.get(f"/api/reports/{rid}")).json()
        assert set(decided) == {
            "id", "status", "outcome", "created_at", "due_at", "decided_at"
        }  # fmt: skip
        assert (decided["id"], decided["status"]) == (rid, "decided")
        assert decided["outcome"] == outcome
        assert decided["decided_at"] >= decided["created_at"]
    for unknown in ("0" * 20, "nope", ids[0] + "0", "../" + ids[0]):
        response = await visitor.get(f"/api/reports/{unknown}")
        assert response.status == 404, unknown
        assert await response.json() == {"error": "NOT_FOUND"}


async def test_a_move_against_keys_the_work_no_longer_holds_changes_nothing(
    redis: Redis, tmp_path: Path
) -> None:
    """rekey answers STALE (the caller then deletes its copies), and the work
    keeps the keys it holds."""
    await Ledger(redis, trial_credits=5, expire_months=24).open(
        "stale1", "stale1@example.com", "s" * 32
    )
    (work,) = await make_works(redis, tmp_path, "stale1", 1)
    works = WorkStore(redis, SquareStore(redis))
    held = (work["media_key"], work["thumb_key"])
    moved = ("x.png", "/media/x.png")
    assert not await works.rekey(
        "stale1", work["id"], ("other.png", *moved), (held[1], "y.webp", "/y")
    )
    owned = await works.owned("stale1", work["id"])
    assert owned is not None
    assert (owned.record["media_key"], owned.record["thumb_key"]) == held
    assert await works.rekey(
        "stale1", work["id"], (held[0], *moved), (held[1], "y.webp", "/y")
    )
    owned = await works.owned("stale1", work["id"])
    assert owned is not None
    assert owned.record["media_url"] == "/media/x.png"


async def test_an_operator_removes_a_work_found_without_a_report(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """`studio works remove ID`: as a report's remove, logged; a command that
    cannot move the files leaves the work where it was, to run again."""
    author, visitor = await studio(), await studio()
    me = await sign_in(author, mail_server, new_address())
    first, second = await _published(author, redis, tmp_path, me["id"], 2)
    before = await (await author.get(f"/api/works/{first}")).json()

    async def works(action: str, wid: str, media: Path) -> Finished:
        environ = _operator(redis_server, media)
        return await studio_command("works", action, wid, environ=environ)

    done = await works("remove", first, tmp_path / "media")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{first} removed"
    assert await _square(visitor) == [second]
    after = await (await author.get(f"/api/works/{first}")).json()
    assert after["removed_at"]
    assert (await visitor.get(before["media_url"])).status == 404
    assert (await author.get(after["media_url"])).status == 200
    again = await works("remove", first, tmp_path / "media")
    assert again.returncode == 1
    assert "no work" in again.stderr
    lost = await works("remove", second, tmp_path / "elsewhere")
    assert lost.returncode == 1
    assert "could not be moved (MissingMedia" in lost.stderr
    assert await _square(visitor) == [second]  # still there: run it again
    log = [r async for r in ModerationLog(redis, 180).read()]
    assert [(r["source"], r["verdict"], r["work"]) for r in log] == [
        ("operator", "remove", first)
    ]
