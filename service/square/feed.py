"""The square: published works, newest first, for anonymous visitors."""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import json
import logging
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal, cast

from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..auth.sessions import anonymous
from ..keys import DEGRADED, SQUARE
from ..store.deadline import within

# All square keys share one hash tag, so publishing is one atomic step on Cluster too.
_TAG: Final = "studio:square:{square}"
FEED: Final = f"{_TAG}:feed"
SEQUENCE: Final = f"{_TAG}:seq"
DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 50
CACHE_CONTROL: Final = "max-age=10"
# Reads are cached in process: fresh for FRESH seconds; while Redis is down or slow
# (no answer in READ_BUDGET) the last good copy is served for up to STALE seconds.
FRESH_SECONDS: Final = 2.0
STALE_SECONDS: Final = 600.0
READ_BUDGET_SECONDS: Final = 0.1
# After a failed read, stop asking Redis for this long and serve what we have.
BACKOFF_SECONDS: Final = 1.0
_LOGGER: Final = logging.getLogger(__name__)

_PUBLISH: Final = """
local seq = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[1], seq, ARGV[1])
return seq
"""
_UNPUBLISH: Final = """
redis.call('DEL', KEYS[2])
return redis.call('ZREM', KEYS[1], ARGV[1])
"""


@dataclass(frozen=True, slots=True)
class Work:
    """A published image or video, without anything personal about its author."""

    id: str
    kind: Literal["image", "video"]
    model: str
    prompt: str
    media_url: str
    width: int
    height: int
    published_at: str


def _work_key(work_id: str) -> str:
    return f"{_TAG}:work:{work_id}"


def encode_cursor(sequence: int) -> str:
    """Wrap a feed position as an opaque cursor."""
    return base64.urlsafe_b64encode(f"v1:{sequence}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> int:
    """Read a cursor back, or raise 400 BAD_REQUEST."""
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        version, _, number = text.partition(":")
        sequence = int(number)
    except (binascii.Error, UnicodeDecodeError, ValueError) as err:
        raise ApiError(400, "BAD_REQUEST") from err
    if version != "v1" or sequence < 1 or not number.isdigit():
        raise ApiError(400, "BAD_REQUEST")
    return sequence


class _ReadCache:
    """Recent answers, fresh for a moment and kept as a fallback for a while."""

    def __init__(self, max_entries: int = 1024) -> None:
        self._entries: OrderedDict[object, tuple[float, object]] = OrderedDict()
        self._max = max_entries

    def get(self, key: object, max_age: float) -> tuple[bool, object]:
        if (entry := self._entries.get(key)) and time.monotonic() - entry[0] <= max_age:
            return True, entry[1]
        return False, None

    def put(self, key: object, value: object) -> None:
        self._entries[key] = (time.monotonic(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()


class SquareStore:
    """Publish, unpublish, list and read works of the square."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._publish = redis.register_script(_PUBLISH)
        self._unpublish = redis.register_script(_UNPUBLISH)
        self._cache = _ReadCache()
        self._reads: dict[object, asyncio.Future[Any]] = {}
        self._down_until = 0.0

    async def _cached(
        self,
        key: object,
        read: Callable[[], Awaitable[object]],
        *,
        degraded: bool = False,
    ) -> Any:
        """Serve fresh from memory, else read Redis in budget, else serve stale.

        Concurrent misses of one key share a single read. When Redis already
        failed this request (`degraded`), a stale copy is served without asking
        it again, so one request never waits on Redis twice.
        """
        hit, value = self._cache.get(key, STALE_SECONDS if degraded else FRESH_SECONDS)
        if hit:
            return value
        if (pending := self._reads.get(key)) is None:
            pending = asyncio.ensure_future(self._read(key, read))
            self._reads[key] = pending
            pending.add_done_callback(lambda _: self._reads.pop(key, None))
        return await asyncio.shield(pending)

    async def _read(self, key: object, read: Callable[[], Awaitable[object]]) -> Any:
        try:
            if time.monotonic() < self._down_until:
                raise TimeoutError("backing off a failing Redis")
            value = await within(READ_BUDGET_SECONDS, read())
        except (RedisError, OSError, TimeoutError):
            self._down_until = max(self._down_until, time.monotonic() + BACKOFF_SECONDS)
            hit, value = self._cache.get(key, STALE_SECONDS)
            if not hit:
                raise
            _LOGGER.warning("square served from memory: Redis unavailable")
            return value
        self._cache.put(key, value)
        return value

    async def publish(
        self,
        *,
        kind: Literal["image", "video"],
        model: str,
        prompt: str,
        media_url: str,
        width: int,
        height: int,
    ) -> Work:
        """Put a work at the top of the square."""
        now = (
            dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        )
        work = Work(
            secrets.token_hex(8), kind, model, prompt, media_url, width, height, now
        )
        keys = [FEED, SEQUENCE, _work_key(work.id)]
        await self._publish(keys=keys, args=[work.id, json.dumps(asdict(work))])
        self._cache.clear()
        return work

    async def unpublish(self, work_id: str) -> bool:
        """Take a work off the square; tell whether it was there."""
        keys = [FEED, _work_key(work_id)]
        removed = bool(await self._unpublish(keys=keys, args=[work_id]))
        self._cache.clear()
        return removed

    async def work_json(self, work_id: str, *, degraded: bool = False) -> bytes | None:
        """Return a published work as the JSON the API answers with."""

        async def read() -> bytes | None:
            raw = cast(bytes | None, await self._redis.get(_work_key(work_id)))
            return raw

        body: bytes | None = await self._cached(
            ("work", work_id), read, degraded=degraded
        )
        return body

    async def page_json(
        self, before: int | None, limit: int, *, degraded: bool = False
    ) -> bytes:
        """Return a page of the feed as the JSON the API answers with."""

        async def read() -> bytes:
            return await self._page(before, limit)

        body: bytes = await self._cached(
            ("page", before, limit), read, degraded=degraded
        )
        return body

    async def get(self, work_id: str) -> Work | None:
        """Return a published work."""
        body = await self.work_json(work_id)
        return Work(**json.loads(body)) if body else None

    async def _page(self, before: int | None, limit: int) -> bytes:
        """Assemble a page from the works' stored JSON, without re-encoding it."""
        top: int | str = f"({before}" if before is not None else "+inf"
        found: list[tuple[bytes, float]] = await self._redis.zrevrangebyscore(
            FEED, top, "-inf", start=0, num=limit + 1, withscores=True
        )  # type: ignore[assignment]
        more = len(found) > limit
        rows = found[:limit]
        keys = [_work_key(member.decode()) for member, _ in rows]
        raws = cast(list[bytes | None], await self._redis.mget(keys) if keys else [])
        cursor = encode_cursor(int(rows[-1][1])) if more and rows else None
        return b"".join(
            (
                b'{"items": [',
                b", ".join(raw for raw in raws if raw),
                b'], "next_cursor": ',
                json.dumps(cursor).encode(),
                b"}",
            )
        )


def _limit(raw: str | None) -> int:
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ApiError(400, "BAD_REQUEST")
    return int(raw)


def _json(body: bytes) -> web.Response:
    return web.Response(
        body=body,
        content_type="application/json",
        headers={"Cache-Control": CACHE_CONTROL},
    )


@anonymous
async def list_square(request: web.Request) -> web.StreamResponse:
    """List published works, newest first, a page at a time."""
    query = request.query
    if set(query) - {"cursor", "limit"}:
        raise ApiError(400, "BAD_REQUEST")
    limit = _limit(query.get("limit"))
    cursor = query.get("cursor") or None
    before = decode_cursor(cursor) if cursor else None
    store = request.config_dict[SQUARE]
    degraded = request.get(DEGRADED, False)
    return _json(await store.page_json(before, limit, degraded=degraded))


@anonymous
async def get_work(request: web.Request) -> web.StreamResponse:
    """Show one published work, or 404."""
    work_id = request.match_info["work_id"]
    store = request.config_dict[SQUARE]
    degraded = request.get(DEGRADED, False)
    body = (
        await store.work_json(work_id, degraded=degraded) if work_id.isalnum() else None
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
