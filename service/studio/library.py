"""The library's /api endpoints: my works, favorites, publishing and reports."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_json
from ..api.query import bad_field, list_params, read_cursor
from ..auth.sessions import SESSION
from ..keys import REDIS, SETTINGS
from ..limits.http import enforce
from ..moderation.log import Record
from ..moderation.prompts import MODERATION
from ..square.feed import SQUARE
from .collections import COLLECTIONS, works_index
from .keys import MEDIA, WORKS
from .ledger import account_key
from .search import read_query, walk, works_with
from .works import WorkNotFound, WorkRemoved, mine_view

MAX_REASON: Final = 500
# Routes whose handlers charge a per-account write limit.
LIBRARY_LIMITED: Final = frozenset(
    {
        "work_publish",
        "work_unpublish",
        "work_favorite",
        "work_unfavorite",
        "work_report",
    }
)


def _me(request: web.Request) -> str:
    return request[SESSION].account_id


def _wid(request: web.Request) -> str:
    wid = request.match_info["wid"]
    if not (wid.isascii() and wid.isalnum() and len(wid) <= 64):
        raise ApiError(404, "NOT_FOUND")
    return wid


async def _limit(request: web.Request, policy: str) -> None:
    """Charge a per-account write limit; a slow Redis falls back to a local bucket.

    These limits only slow an abusive account down: refusing a favorite
    because the limiter was late would punish everyone else.
    """
    policies = [request.app[SETTINGS].limits[policy]]
    await enforce(request, f"acct:{_me(request)}", policies, fail_open=True)


async def list_works(request: web.Request) -> web.StreamResponse:
    """List my works, newest first; favorite=true keeps the ones I favorited."""
    allowed = frozenset({"favorite", "q", "collection"})
    limit, cursor = list_params(request.query, allowed)
    favorite = request.query.get("favorite", "false")
    if favorite not in ("true", "false"):
        raise bad_field("favorite")
    words = read_query(request.query)
    if words is not None or "collection" in request.query:
        return await _found_works(request, limit, cursor, words, favorite == "true")
    items, last = await request.app[WORKS].page(
        _me(request),
        before=read_cursor(cursor, "w"),
        limit=limit,
        favorite_only=favorite == "true",
    )
    return json_response({"items": items, "next_cursor": f"w{last}" if last else None})


async def _found_works(
    request: web.Request,
    limit: int,
    cursor: str,
    words: str | None,
    favorite_only: bool,
) -> web.StreamResponse:
    """List my works holding `q` (newest first), or those in a collection (most
    recently added first); favorite=true keeps only the ones I favorited."""
    app, me = request.app, _me(request)
    index, mark = f"{account_key(me)}:works", "w"
    if (cid := request.query.get("collection")) is not None:
        if not (cid.isascii() and cid.isalnum()) or not await app[COLLECTIONS].exists(
            me, cid
        ):
            raise ApiError(404, "NOT_FOUND")
        index, mark = works_index(me, cid), "c"
    keep = works_with(app[REDIS], me, words, favorite_only=favorite_only)
    wids, last = await walk(
        app[REDIS], index, before=read_cursor(cursor, mark), limit=limit, keep=keep
    )
    items = await app[WORKS].views(me, wids)
    return json_response(
        {"items": items, "next_cursor": f"{mark}{last}" if last else None}
    )


async def get_work(request: web.Request) -> web.StreamResponse:
    """Show a work of mine, or anyone's published one; everything else is 404."""
    app, me, wid = request.app, _me(request), _wid(request)
    works = app[WORKS]
    if owned := await works.owned(me, wid):
        (favorite,) = await works.favorited(me, [wid])
        return json_response(mine_view(owned.record, owned.favorites, favorite))
    if (published := await app[SQUARE].get(wid)) is None:
        raise ApiError(404, "NOT_FOUND")
    (favorite,) = await works.favorited(me, [wid])
    return json_response({**published.public(), "favorite": favorite})


async def delete_work(request: web.Request) -> web.StreamResponse:
    """Delete my work everywhere: library, square, others' favorites, its media."""
    app = request.app
    try:
        record = await app[WORKS].delete(_me(request), _wid(request))
    except WorkNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    for name in ("media_key", "thumb_key"):
        if key := record.get(name):
            await app[MEDIA].delete(key)
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


async def publish(request: web.Request) -> web.StreamResponse:
    """Publish my work: first in the square, with nothing about me."""
    await _limit(request, "write")
    app, me, wid = request.app, _me(request), _wid(request)
    if owned := await app[WORKS].owned(me, wid):  # the list may have grown since
        prompt = {"prompt": owned.record["prompt"]}
        await app[MODERATION].screen(prompt, source="publish", account=me, work=wid)
    try:
        work = await app[WORKS].publish(me, wid)
    except WorkNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    except WorkRemoved:
        raise ApiError(409, "WORK_REMOVED") from None
    return json_response(work)


async def unpublish(request: web.Request) -> web.StreamResponse:
    """Take my work off the square, from every page, at once."""
    await _limit(request, "write")
    try:
        work = await request.app[WORKS].unpublish(_me(request), _wid(request))
    except WorkNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return json_response(work)


async def _favorite(request: web.Request, on: bool) -> web.StreamResponse:
    await _limit(request, "write")
    try:
        await request.app[WORKS].favorite(_me(request), _wid(request), on)
    except WorkNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


async def favorite(request: web.Request) -> web.StreamResponse:
    """Favorite a work of mine or a published one (idempotent)."""
    return await _favorite(request, True)


async def unfavorite(request: web.Request) -> web.StreamResponse:
    """Take my favorite back (idempotent)."""
    return await _favorite(request, False)


async def list_favorites(request: web.Request) -> web.StreamResponse:
    """List the works I favorited, most recent favorite first."""
    limit, cursor = list_params(request.query, frozenset())
    items, last = await request.app[WORKS].favorites_page(
        _me(request), before=read_cursor(cursor, "f"), limit=limit
    )
    return json_response({"items": items, "next_cursor": f"f{last}" if last else None})


async def report(request: web.Request) -> web.StreamResponse:
    """Report a published work; enough distinct reporters take it off the square."""
    body: dict[str, Any] = await read_json(
        request, required={"reason"}, name_field=True
    )
    await _limit(request, "report")
    reason = body["reason"]
    if not isinstance(reason, str) or not 1 <= len(reason.strip()) <= MAX_REASON:
        raise bad_field("reason")
    app = request.app
    threshold = app[SETTINGS].workbench.hide_after_reports
    me, wid = _me(request), _wid(request)
    try:
        outcome, owner = await app[WORKS].report(me, wid, threshold)
    except WorkNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    if outcome in ("OK", "HIDE"):  # counted: one record each (CONTRACT §11)
        hid = f"; the work left the square at {threshold} reporters"
        note = f"reporter {me}{hid if outcome == 'HIDE' else ''}"
        record = Record(
            source="report",
            verdict="reported",
            account=owner,
            work=wid,
            text=reason.strip(),
            note=note,
        )
        await app[MODERATION].log.append(record)
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


def setup_library_routes(api: ApiBoundary) -> None:
    """Register the library endpoints behind the /api boundary."""
    api.add_routes(
        [
            web.get("/works", list_works, name="works_list"),
            web.get("/works/{wid}", get_work, name="work"),
            web.delete("/works/{wid}", delete_work, name="work_delete"),
            web.post("/works/{wid}/publish", publish, name="work_publish"),
            web.delete("/works/{wid}/publish", unpublish, name="work_unpublish"),
            web.put("/works/{wid}/favorite", favorite, name="work_favorite"),
            web.delete("/works/{wid}/favorite", unfavorite, name="work_unfavorite"),
            web.post("/works/{wid}/report", report, name="work_report"),
            web.get("/favorites", list_favorites, name="favorites"),
        ]
    )
