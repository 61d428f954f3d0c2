"""The square: published works for anonymous visitors, new or top, images or videos."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from aiohttp import web
from multidict import MultiMapping
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.query import read_limit
from ..auth.sessions import anonymous
from ..limits.keys import DEGRADED, READ_ALONG
from ..store.deadline import within
from ..web.representation import DirectResponse, json_head

# All square keys share one hash tag, so every write is one atomic step on Cluster too.
PREFIX: Final = "studio:square:{square}"
VERSION: Final = f"{PREFIX}:version"
CACHE_CONTROL: Final = "max-age=10"
# Reads are cached in process: fresh for FRESH seconds while the square's version
# (bumped by every removal) is unchanged; while Redis is down or slow (no answer
# in READ_BUDGET) the last good copy is served for up to STALE seconds.
FRESH_SECONDS: Final = 2.0
STALE_SECONDS: Final = 600.0
READ_BUDGET_SECONDS: Final = 0.1
# With no copy in memory to fall back on (a process's first read of a page), a
# slow answer is still better than none: the read may take this long.
COLD_BUDGET_SECONDS: Final = 1.0
# After a failed read, stop asking Redis for this long and serve what we have.
BACKOFF_SECONDS: Final = 1.0
_LOGGER: Final = logging.getLogger(__name__)
_SCRIPT: Final = (Path(__file__).parent / "lua" / "square.lua").read_text()
Sort = Literal["new", "top"]
Kind = Literal["image", "video"]


@dataclass(frozen=True, slots=True)
class Work:
    """A published work as the square shows it: nothing about its author."""

    id: str
    kind: Kind
    model: str
    prompt: str
    media_url: str
    thumb_url: str
    width: int
    height: int
    content_type: str
    published_at: str = ""
    favorites: int = 0
    duration: float | None = None

    def public(self) -> dict[str, Any]:
        """Return the square's JSON object (duration only for videos)."""
        out: dict[str, Any] = {
            "id": self.id,
            "kind": self.kind,
            "model": self.model,
            "prompt": self.prompt,
            "media_url": self.media_url,
            "thumb_url": self.thumb_url,
            "width": self.width,
            "height": self.height,
        }
        if self.duration is not None:
            out["duration"] = self.duration
        out |= {
            "content_type": self.content_type,
            "published_at": self.published_at,
            "favorites": self.favorites,
        }
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Work:
        """Read a square item back."""
        fields = {name: data[name] for name in cls.__slots__ if name in data}
        return cls(**fields)


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def encode_cursor(sort: Sort, score: str, epoch: str = "") -> str:
    """Wrap a page boundary (and a `top` snapshot) as an opaque cursor."""
    return _encode(f"v1:{score}" if sort == "new" else f"t1:{epoch}:{score}")


def decode_cursor(cursor: str, sort: Sort) -> tuple[str, str]:
    """Read a cursor back as (score, epoch), or raise 400 with field cursor."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise ApiError(400, "BAD_REQUEST", field="cursor") from err
    parts = text.split(":")
    expected = ("v1", 2) if sort == "new" else ("t1", 3)
    if (parts[0], len(parts)) != expected or not all(
        part.isascii() and part.isdigit() and len(part) <= 18 for part in parts[1:]
    ):
        raise ApiError(400, "BAD_REQUEST", field="cursor")
    return parts[-1], parts[1] if sort == "top" else ""


class _ReadCache:
    """Recent answers with the square version they were read at."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._entries: OrderedDict[object, tuple[float, int, object]] = OrderedDict()
        self._max = max_entries

    def get(
        self, key: object, max_age: float, version: int | None
    ) -> tuple[bool, object]:
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[0] > max_age:
            return False, None
        if version is not None and entry[1] != version:
            return False, None
        return True, entry[2]

    def put(self, key: object, version: int, value: object) -> None:
        self._entries[key] = (time.monotonic(), version, value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)


class _VersionProbe:
    """Read the square's version once per event-loop turn for every request in it.

    A request only shares a read sent after it arrived, so once a removal has
    been answered, no later request of any process is served a page from
    before it.
    """

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._next: asyncio.Future[int] | None = None

    def current(self) -> asyncio.Future[int]:
        """Return the version as of a read sent after this call."""
        if self._next is None:
            loop = asyncio.get_running_loop()
            self._next = loop.create_future()
            loop.call_soon(self._send)
        return self._next

    def _send(self) -> None:
        future, self._next = self._next, None
        assert future is not None
        task = asyncio.ensure_future(self._read())
        task.add_done_callback(lambda done: _settle(future, done))

    async def _read(self) -> int:
        return int(await self._redis.get(VERSION) or 0)


def _settle(future: asyncio.Future[int], done: asyncio.Future[int]) -> None:
    if future.done():
        return
    if done.cancelled():
        future.cancel()
    elif (error := done.exception()) is not None:
        future.set_exception(error)
    else:
        future.set_result(done.result())


class SquareStore:
    """Publish, remove, rank, list and read works of the square."""

    def __init__(self, redis: Redis, read_budget: float = READ_BUDGET_SECONDS) -> None:
        self._redis = redis
        self._read_budget = read_budget
        self._script = redis.register_script(_SCRIPT)
        self._cache = _ReadCache()
        self._probe = _VersionProbe(redis)
        self._reads: dict[object, asyncio.Future[Any]] = {}
        self._down_until = 0.0

    async def _run(self, *args: str | int) -> Any:
        return await self._script(keys=[PREFIX], args=list(args))

    def _fresh(self, key: object, version: int | None) -> tuple[object] | None:
        """A copy still fresh at the version the limiter read along (usually one
        is), without a coroutine; None to ask `_cached`."""
        if version is None:
            return None
        hit, value = self._cache.get(key, FRESH_SECONDS, version)
        return (value,) if hit else None

    async def _cached(
        self,
        key: object,
        read: Callable[[], Awaitable[object]],
        *,
        degraded: bool = False,
        version: int | None = None,
    ) -> Any:
        """Serve from memory while fresh and current, else read Redis in budget.

        Concurrent misses of one key share a single read. When Redis already
        failed this request (`degraded`), or does not answer the version in
        budget, a stale copy is served without asking it again; with no copy
        at all, Redis gets the longer cold budget instead of a quick 503.
        """
        stale, fallback = self._cache.get(key, STALE_SECONDS, None)
        budget = self._read_budget if stale else COLD_BUDGET_SECONDS
        asking = not degraded or not stale  # with nothing to serve, ask anyway
        if version is None and asking and time.monotonic() >= self._down_until:
            try:
                version = await within(budget, self._probe.current())
            except (RedisError, OSError, TimeoutError):
                self._down_until = time.monotonic() + BACKOFF_SECONDS
        if version is None:
            if stale:
                _LOGGER.warning("square served from memory: Redis unavailable")
                return fallback
            raise TimeoutError("square unavailable")
        hit, value = self._cache.get(key, FRESH_SECONDS, version)
        if hit:
            return value
        pending = self._reads.get((key, version))
        if pending is None:
            pending = asyncio.ensure_future(self._read(key, version, read, budget))
            self._reads[(key, version)] = pending
            pending.add_done_callback(lambda _: self._reads.pop((key, version), None))
        return await asyncio.shield(pending)

    async def _read(
        self,
        key: object,
        version: int,
        read: Callable[[], Awaitable[object]],
        budget: float,
    ) -> Any:
        try:
            value = await within(budget, read())
        except (RedisError, OSError, TimeoutError):
            self._down_until = max(self._down_until, time.monotonic() + BACKOFF_SECONDS)
            raise
        self._cache.put(key, version, value)
        return value

    async def publish(self, work: Work, owner: str) -> Work:
        """Put a work at the top of `new`; publishing twice changes nothing."""
        body = {k: v for k, v in work.public().items() if k not in ("published_at",)}
        stored = await self._run(
            "publish", work.id, owner, work.kind, work.favorites,
            json.dumps(body, ensure_ascii=False), _now_iso(),
        )  # fmt: skip
        return Work.from_json(json.loads(stored))

    async def remove(self, work_id: str) -> bool:
        """Take a work off every index; every process's cached pages go stale."""
        return bool(await self._run("remove", work_id))

    async def unpublish(self, work_id: str) -> bool:
        """Take a work off the square; tell whether it was there."""
        return await self.remove(work_id)

    async def set_favorites(self, work_id: str, count: int, change: int) -> None:
        """Rank a work by its favorites; an older change never overwrites a newer."""
        await self._run("favorites", work_id, count, change)

    async def owner(self, work_id: str) -> str | None:
        """Return the account that published a work (never shown to anyone)."""
        found = await self._redis.hget(f"{PREFIX}:meta:{work_id}", "owner")
        return found.decode() if isinstance(found, bytes) else found

    async def work_json(
        self, work_id: str, *, degraded: bool = False, version: int | None = None
    ) -> bytes | None:
        """Return a published work as the JSON the API answers with."""
        key = ("work", work_id)
        if (fresh := self._fresh(key, version)) is not None:
            return cast(bytes | None, fresh[0])

        async def read() -> bytes | None:
            return cast(bytes | None, await self._redis.get(f"{PREFIX}:work:{work_id}"))

        body: bytes | None = await self._cached(
            key, read, degraded=degraded, version=version
        )
        return body

    async def get(self, work_id: str) -> Work | None:
        """Return a published work, read fresh."""
        return (await self.get_many([work_id]))[0]

    async def get_many(self, work_ids: Sequence[str]) -> list[Work | None]:
        """Return published works, read fresh in one MGET (one slot: one hash tag),
        in order; None for each one not in the square."""
        if not work_ids:
            return []
        raws = await self._redis.mget([f"{PREFIX}:work:{wid}" for wid in work_ids])
        return [Work.from_json(json.loads(raw)) if raw else None for raw in raws]

    async def page_json(
        self,
        sort: Sort,
        kind: str,
        cursor: tuple[str, str] | None,
        limit: int,
        *,
        degraded: bool = False,
        version: int | None = None,
    ) -> bytes:
        """Return a page as the JSON the API answers with."""
        key = ("page", sort, kind, cursor, limit)
        if (fresh := self._fresh(key, version)) is not None:
            return cast(bytes, fresh[0])

        async def read() -> bytes:
            return await self._page(sort, kind, cursor, limit)

        body: bytes = await self._cached(key, read, degraded=degraded, version=version)
        return body

    async def _page(
        self, sort: Sort, kind: str, cursor: tuple[str, str] | None, limit: int
    ) -> bytes:
        """Assemble a page from the works' stored JSON, without re-encoding it."""
        before, epoch = cursor or ("", "")
        now_ms = int(time.time() * 1000)
        reply = await self._run("page", sort, kind, before, limit, epoch, now_ms)
        next_score, epoch = _text(reply[0]), _text(reply[1])
        raws = [raw if isinstance(raw, bytes) else raw.encode() for raw in reply[2:]]
        cursor_out = encode_cursor(sort, next_score, epoch) if next_score else None
        return b"".join(
            (
                b'{"items": [',
                b", ".join(raws),
                b'], "next_cursor": ',
                json.dumps(cursor_out).encode(),
                b"}",
            )
        )


SQUARE: Final = web.AppKey("square", SquareStore)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


_HEAD: Final = json_head(CACHE_CONTROL)


def _json(body: bytes) -> web.Response:
    return DirectResponse(body=body, headers=_HEAD)


def _version(request: web.Request) -> int | None:
    """Return the square version the limiter read along, if it did."""
    if (value := request.get(READ_ALONG)) is None:
        return None
    return int(value)


_QUERY: Final = frozenset({"cursor", "limit", "sort", "kind"})


# What a request with no query asks for: the first page of the newest works.
_FIRST_PAGE: Final[tuple[Sort, str, tuple[str, str] | None, int]] = (
    "new",
    "",
    None,
    read_limit(None),
)


def _page_query(
    query: MultiMapping[str],
) -> tuple[Sort, str, tuple[str, str] | None, int]:
    """Read sort, kind, cursor and limit strictly, or raise 400 with the field."""
    for name in query:
        if name not in _QUERY or len(query.getall(name)) > 1:
            raise ApiError(400, "BAD_REQUEST", field=name)
    limit = read_limit(query.get("limit"))
    sort = query.get("sort", "new")
    if sort not in ("new", "top"):
        raise ApiError(400, "BAD_REQUEST", field="sort")
    kind = query.get("kind", "")
    if kind not in ("", "image", "video") or ("kind" in query and not kind):
        raise ApiError(400, "BAD_REQUEST", field="kind")
    raw_cursor = query.get("cursor") or None
    sort_ = cast(Sort, sort)
    cursor = decode_cursor(raw_cursor, sort_) if raw_cursor else None
    return sort_, kind, cursor, limit


@anonymous
async def list_square(request: web.Request) -> web.StreamResponse:
    """List published works, newest or most favorited first, a page at a time."""
    # No query (the raw target has no "?"): no query parsed, about a microsecond.
    first = "?" not in request.raw_path
    sort, kind, cursor, limit = _FIRST_PAGE if first else _page_query(request.query)
    body = await request.app[SQUARE].page_json(
        sort,
        kind,
        cursor,
        limit,
        degraded=request.get(DEGRADED, False),
        version=_version(request),
    )
    return _json(body)


@anonymous
async def get_work(request: web.Request) -> web.StreamResponse:
    """Show one published work, or 404."""
    work_id = request.match_info["work_id"]
    store = request.app[SQUARE]
    degraded = request.get(DEGRADED, False)
    body = (
        await store.work_json(work_id, degraded=degraded, version=_version(request))
        if work_id.isascii() and work_id.isalnum()
        else None
    )
    if body is None:
        raise ApiError(404, "NOT_FOUND")
    return _json(body)


def setup_square_routes(api: ApiBoundary) -> None:
    """Register the square's read endpoints behind the /api boundary."""
    api.add_routes(
        [
            web.get("/square", list_square, name="square_list"),
            web.get("/square/{work_id}", get_work, name="square_item"),
        ]
    )
