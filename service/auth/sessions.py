"""Sessions in Redis behind the studio_session cookie; the session boundary of /api."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import secrets
import time
from collections.abc import AsyncIterator, Callable
from typing import Final, TypeVar

from aiohttp import web
from aiohttp.typedefs import Handler
from redis.asyncio import Redis

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..keys import REDIS
from ..moderation.suspension import AccountSuspended, refuse_if_suspended
from ..store.deadline import within
from .cookies import read_cookie
from .session_cache import ENDED_CHANNEL, SHUTDOWN_SECONDS, Session, SessionCache

COOKIE: Final = "studio_session"
IDLE_SECONDS: Final = 7 * 24 * 3600
ABSOLUTE_SECONDS: Final = 30 * 24 * 3600
TOUCH_SECONDS: Final = 3600
# How long a request waits for its session before answering 503 UNAVAILABLE.
SESSION_BUDGET_SECONDS: Final = 0.25
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")

# Touch only a session that still exists: a concurrent logout must stay final.
_TOUCH: Final = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], 'seen', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1
"""

# End a session, and tell every app process to close the event streams it fed.
_END: Final = """
local account = redis.call('HGET', KEYS[1], 'account')
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], KEYS[1])
if account then
  redis.call('PUBLISH', 'studio:events:' .. account,
             cjson.encode({event = '_logout', session = KEYS[1]}))
end
return account
"""

_ANONYMOUS: Final[set[Handler]] = set()
H = TypeVar("H", bound=Callable[..., object])


def anonymous(handler: H) -> H:
    """Mark an /api handler as callable without a session; every other one needs one."""
    _ANONYMOUS.add(handler)  # type: ignore[arg-type]
    return handler


def is_anonymous(handler: Handler) -> bool:
    """Tell whether a handler was marked anonymous."""
    return handler in _ANONYMOUS


def session_key(token: str) -> str:
    """Name a session by the SHA-256 of its token; the raw token is never stored."""
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f"studio:session:{{{digest}}}"


def sessions_index_key(account_id: str) -> str:
    """Name the set of an account's sessions, under the account's hash tag."""
    return f"studio:acct:{{{account_id}}}:sessions"


def _ttl(created: int, now: int) -> int:
    return max(1, min(IDLE_SECONDS, created + ABSOLUTE_SECONDS - now))


class SessionStore:
    """Create, load (touching at most hourly) and delete sessions."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._touch = redis.register_script(_TOUCH)
        self._end = redis.register_script(_END)
        self.cache = SessionCache()

    async def create(self, account_id: str) -> tuple[str, Session]:
        """Open a session for an account; return the cookie token and the session.

        The account's index of sessions is written first: an index entry whose
        session never came to be is harmless, a session missing from the index
        would escape "sign out everywhere". A suspended account gets none
        (AccountSuspended).
        """
        token = base64.urlsafe_b64encode(secrets.token_bytes(32)).rstrip(b"=").decode()
        now = int(time.time())
        key = session_key(token)
        index = sessions_index_key(account_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.zadd(index, {key: now})
            pipe.zremrangebyscore(index, "-inf", now - ABSOLUTE_SECONDS)
            pipe.expire(index, ABSOLUTE_SECONDS)
            await pipe.execute()
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"account": account_id, "created": now, "seen": now})
            pipe.expire(key, _ttl(now, now))
            await pipe.execute()
        try:  # after the write: a suspension racing it finds the session, or we it
            await refuse_if_suspended(self._redis, account_id)
        except AccountSuspended:
            await self._redis.delete(key)
            await self._redis.zrem(index, key)
            raise
        return token, Session(key=key, account_id=account_id, created=now, seen=now)

    def cached(self, token: str) -> Session | None:
        """Return the token's session from this process's cache, if it holds it
        and it has not reached its absolute expiry: no Redis, no deadline.

        Only sessions read from Redis are cached, so a malformed token misses
        (and is never hashed: a cookie may hold bytes that are not UTF-8).
        """
        if not _TOKEN.fullmatch(token):
            return None
        key = session_key(token)
        if (cached := self.cache.get(key)) is not None:
            if int(time.time()) - cached.created < ABSOLUTE_SECONDS:
                return cached
            self.cache.drop(key)
        return None

    async def load(self, token: str) -> Session | None:
        """Return the live session of a token, refreshing its idle expiry hourly."""
        if (cached := self.cached(token)) is not None:
            return cached
        return await self.fetch(token)

    async def fetch(self, token: str) -> Session | None:
        """Read a session from Redis (the cache missed), then cache it."""
        if not _TOKEN.fullmatch(token):
            return None
        key = session_key(token)
        now = int(time.time())
        epoch = self.cache.epoch
        fields = await self._redis.hgetall(key)
        if not {b"account", b"created", b"seen"} <= set(fields):
            return None  # absent, or not a whole record
        created, seen = int(fields[b"created"]), int(fields[b"seen"])
        if now - created >= ABSOLUTE_SECONDS:
            await self._redis.delete(key)
            return None
        if now - seen >= TOUCH_SECONDS:
            if not await self.touch(key, created, now):
                return None  # ended while we read it
            seen = now
        account = fields[b"account"]
        text = account.decode() if isinstance(account, bytes) else str(account)
        session = Session(key, text, created, seen)
        self.cache.put(session, epoch)
        return session

    async def touch(self, key: str, created: int, now: int) -> bool:
        """Mark a session seen and extend its idle expiry, if it still exists."""
        return bool(await self._touch(keys=[key], args=[now, _ttl(created, now)]))

    async def delete(self, token: str) -> None:
        """End a session and its open event streams; unknown tokens are a no-op."""
        if _TOKEN.fullmatch(token):
            key = session_key(token)
            self.cache.drop(key)
            account = await self._end(keys=[key], args=[ENDED_CHANNEL])
            self.cache.drop(key)  # a read that raced the end may have kept it
            if account:
                text = account.decode() if isinstance(account, bytes) else str(account)
                await self._redis.zrem(sessions_index_key(text), key)

    async def end_all(self, account_id: str) -> int:
        """End every session of an account (and their event streams); count them."""
        index = sessions_index_key(account_id)
        found: list[bytes] = await self._redis.zrange(index, 0, -1)  # type: ignore[assignment]
        keys = [key.decode() for key in found]
        ended = 0
        for key in keys:
            if await self._end(keys=[key], args=[ENDED_CHANNEL]):
                ended += 1
            self.cache.drop(key)
        await self._redis.delete(index)
        return ended


SESSIONS: Final = web.AppKey("sessions", SessionStore)
# The session the session layer found for this request (every route not @anonymous).
SESSION: Final = web.RequestKey("session", Session)


def set_session_cookie(
    response: web.StreamResponse, token: str, *, secure: bool
) -> None:
    """Send the cookie: HttpOnly, SameSite=Lax, Path=/, no Domain, absolute max-age."""
    response.set_cookie(
        COOKIE,
        token,
        max_age=ABSOLUTE_SECONDS,
        path="/",
        secure=secure,
        httponly=True,
        samesite="Lax",
    )


def clear_session_cookie(response: web.StreamResponse, *, secure: bool) -> None:
    """Tell the browser to drop the cookie."""
    response.del_cookie(COOKIE, path="/", secure=secure, httponly=True, samesite="Lax")


def setup_sessions(api: ApiBoundary, *, secure: bool) -> None:
    """Answer 401 NO_SESSION before any handler not marked anonymous runs."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if is_anonymous(route.handler):
            return handler

        async def signed_in(request: web.Request) -> web.StreamResponse:
            """Load the session, or refuse; the Authorization header is never read."""
            token = read_cookie(request.headers, COOKIE)
            store = request.app[SESSIONS]
            session = store.cached(token) if token else None
            if session is None and token:
                # A stalled Redis answers 503 in a quarter second, not in seconds.
                session = await within(SESSION_BUDGET_SECONDS, store.fetch(token))
            if session is None:
                headers = {}
                if token is not None:
                    cleared = web.Response()
                    clear_session_cookie(cleared, secure=secure)
                    headers["Set-Cookie"] = cleared.cookies[COOKIE].OutputString()
                raise ApiError(401, "NO_SESSION", headers=headers)
            request[SESSION] = session
            return await handler(request)

        return signed_in

    api.add_layer(layer)


async def session_cache_ctx(app: web.Application) -> AsyncIterator[None]:
    """Listen for ended sessions for the life of the app."""
    stop = asyncio.Event()
    listener = asyncio.ensure_future(app[SESSIONS].cache.listen(app[REDIS], stop))
    yield
    # A cancellation that lands inside a Redis read can be swallowed there; the
    # stop flag ends the loop within a second regardless.
    stop.set()
    listener.cancel()
    await asyncio.wait([listener], timeout=SHUTDOWN_SECONDS)
    if listener.done() and not listener.cancelled():
        listener.exception()  # retrieved: a failure at exit is not news
