"""Collections: named sets of my own works, each work in any number of them."""

from __future__ import annotations

import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Final

from aiohttp import web
from redis.asyncio import Redis

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_json
from ..api.query import bad_field
from ..auth.sessions import SESSION
from ..keys import REDIS
from .ledger import account_key, call_key, iso, now, text

MAX_COLLECTIONS: Final = 100
MAX_NAME: Final = 50
_SCRIPT: Final = (Path(__file__).parent / "lua" / "collections.lua").read_text()


class CollectionNotFound(Exception):
    """Not one of my collections (or, adding, not one of my works)."""


class TooManyCollections(Exception):
    """The account has MAX_COLLECTIONS already."""


def works_index(account_id: str, cid: str) -> str:
    """Name a collection's sorted set of works (score: when it was added)."""
    return f"{account_key(account_id)}:col:{cid}:works"


class Collections:
    """Create, rename, delete and fill one account's collections."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._script = redis.register_script(_SCRIPT)

    async def _run(self, account_id: str, *args: str | int, once: bool = False) -> None:
        """Run an action; `once` for one a retry must not redo (collections.lua)."""
        keys = [account_key(account_id)]
        if once:
            keys.append(call_key(account_id))
        reply = await self._script(keys=keys, args=list(args))
        outcome = text(reply[0])
        if outcome == "NOT_FOUND":
            raise CollectionNotFound
        if outcome == "LIMIT_REACHED":
            raise TooManyCollections

    async def create(self, account_id: str, name: str) -> dict[str, Any]:
        """Make a collection (at most MAX_COLLECTIONS per account)."""
        cid, created = secrets.token_hex(8), iso(now())
        await self._run(account_id, "create", cid, name, created, MAX_COLLECTIONS)
        return {"id": cid, "name": name, "count": 0, "created_at": created}

    async def rename(self, account_id: str, cid: str, name: str) -> dict[str, Any]:
        """Give a collection a new name."""
        await self._run(account_id, "rename", cid, name)
        return await self.one(account_id, cid)

    async def delete(self, account_id: str, cid: str) -> None:
        """Delete a collection; its works stay in the library."""
        await self._run(account_id, "delete", cid, once=True)

    async def put(self, account_id: str, cid: str, wid: str, on: bool) -> None:
        """Add a work of mine to a collection, or take it out (both idempotent)."""
        await self._run(account_id, "add" if on else "remove", cid, wid)

    async def exists(self, account_id: str, cid: str) -> bool:
        """Tell whether the account has this collection."""
        key = f"{account_key(account_id)}:cols"
        return await self._redis.zscore(key, cid) is not None

    async def one(self, account_id: str, cid: str) -> dict[str, Any]:
        """Describe one collection of mine."""
        (found,) = await self._describe(account_id, [cid])
        if found is None:
            raise CollectionNotFound
        return found

    async def mine(self, account_id: str) -> list[dict[str, Any]]:
        """List my collections, newest first."""
        key = f"{account_key(account_id)}:cols"
        found: list[bytes] = await self._redis.zrevrange(key, 0, -1)  # type: ignore[assignment]
        cids = [text(cid) for cid in found]
        return [c for c in await self._describe(account_id, cids) if c is not None]

    async def _describe(
        self, account_id: str, cids: list[str]
    ) -> list[dict[str, Any] | None]:
        key = account_key(account_id)
        async with self._redis.pipeline(transaction=False) as pipe:
            for cid in cids:
                pipe.hgetall(f"{key}:col:{cid}")
                pipe.zcard(works_index(account_id, cid))
            replies = await pipe.execute()
        out: list[dict[str, Any] | None] = []
        for index, cid in enumerate(cids):
            record, count = replies[2 * index], replies[2 * index + 1]
            fields = {text(k): text(v) for k, v in record.items()}
            out.append(
                {
                    "id": cid,
                    "name": fields["name"],
                    "count": int(count),
                    "created_at": fields["created_at"],
                }
                if fields
                else None
            )
        return out


COLLECTIONS: Final = web.AppKey("collections", Collections)


def _me(request: web.Request) -> str:
    return request[SESSION].account_id


def _id(request: web.Request, name: str) -> str:
    value = request.match_info[name]
    if not (value.isascii() and value.isalnum() and len(value) <= 64):
        raise ApiError(404, "NOT_FOUND")
    return value


async def _name(request: web.Request) -> str:
    body = await read_json(request, required={"name"}, name_field=True)
    name = body["name"]
    if not isinstance(name, str) or not 1 <= len(name.strip()) <= MAX_NAME:
        raise bad_field("name")
    return name.strip()


async def create(request: web.Request) -> web.StreamResponse:
    """Make a collection."""
    name = await _name(request)
    try:
        made = await request.app[COLLECTIONS].create(_me(request), name)
    except TooManyCollections:
        raise ApiError(409, "LIMIT_REACHED") from None
    return json_response(made, status=201)


async def list_mine(request: web.Request) -> web.StreamResponse:
    """List my collections, newest first."""
    found = await request.app[COLLECTIONS].mine(_me(request))
    return json_response({"collections": found})


async def rename(request: web.Request) -> web.StreamResponse:
    """Rename a collection of mine."""
    cid, name = _id(request, "cid"), await _name(request)
    try:
        renamed = await request.app[COLLECTIONS].rename(_me(request), cid, name)
    except CollectionNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return json_response(renamed)


async def delete(request: web.Request) -> web.StreamResponse:
    """Delete a collection of mine; its works stay."""
    try:
        await request.app[COLLECTIONS].delete(_me(request), _id(request, "cid"))
    except CollectionNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


async def _put(request: web.Request, on: bool) -> web.StreamResponse:
    cid, wid = _id(request, "cid"), _id(request, "wid")
    try:
        await request.app[COLLECTIONS].put(_me(request), cid, wid, on)
    except CollectionNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return web.Response(status=204, headers={"Cache-Control": "no-store"})


async def add_work(request: web.Request) -> web.StreamResponse:
    """Put a work of mine in a collection (idempotent)."""
    return await _put(request, True)


async def remove_work(request: web.Request) -> web.StreamResponse:
    """Take a work out of a collection (idempotent)."""
    return await _put(request, False)


async def collections_ctx(app: web.Application) -> AsyncIterator[None]:
    """Build the collections store on the app's Redis."""
    app[COLLECTIONS] = Collections(app[REDIS])
    yield


def setup_collection_routes(app: web.Application, api: ApiBoundary) -> None:
    """Register the collection endpoints and their store."""
    api.add_routes(
        [
            web.post("/collections", create, name="collections_create"),
            web.get("/collections", list_mine, name="collections"),
            web.patch("/collections/{cid}", rename, name="collection_rename"),
            web.delete("/collections/{cid}", delete, name="collection_delete"),
            web.put("/collections/{cid}/works/{wid}", add_work, name="collection_add"),
            web.delete(
                "/collections/{cid}/works/{wid}", remove_work, name="collection_remove"
            ),
        ]
    )
    app.cleanup_ctx.append(collections_ctx)
