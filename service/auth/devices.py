"""Device cookies: a browser that signed in before keeps its own code quota.

The OWASP "device cookies" pattern against targeted lockout: a successful
verify gives the browser `studio_device`, bound in Redis to the account and
the address it signed in with. A code request for that same address that
carries the cookie is charged to the device's own buckets, so strangers who
spend the address's anonymous quota do not lock its owner out. The cookie is
`<account id>.<token>`: the record lives under the account's hash tag, and
recognising it is one GET whatever address the request names, so known and
unknown addresses cost the same.
"""

from __future__ import annotations

import hashlib
import logging
import re
import secrets
from typing import Final

from aiohttp import web
from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..store.deadline import within
from .binding import SIGNIN_PATH
from .cookies import read_cookie

_LOGGER: Final = logging.getLogger(__name__)
DEVICE_COOKIE: Final = "studio_device"
DEVICE_SECONDS: Final = 365 * 24 * 3600
# A device that cannot be read this fast counts as anonymous.
RECOGNISE_BUDGET_SECONDS: Final = 0.25
_COOKIE: Final = re.compile(r"([0-9A-Za-z_-]{1,64})\.([A-Za-z0-9_-]{43})")


def device_key(account_id: str, token: str) -> str:
    """Name a device's record by the SHA-256 of its token, under the account's tag."""
    digest = hashlib.sha256(token.encode()).hexdigest()[:32]
    return f"studio:acct:{{{account_id}}}:device:{digest}"


def device_subject(account_id: str, token: str) -> str:
    """Name the rate-limit subject of a device (its record's name, minus the prefix)."""
    return "dev:" + device_key(account_id, token).rsplit(":", 1)[1]


def _parsed(value: str | None) -> tuple[str, str] | None:
    match = _COOKIE.fullmatch(value) if value else None
    return (match.group(1), match.group(2)) if match else None


class DeviceStore:
    """Remember the browsers that signed in, and recognise them on a code request."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def recognise(self, request: web.Request, address_key: str) -> str | None:
        """Return the limit subject of the request's device for this address, or None.

        None (anonymous) for no cookie, a malformed or unknown one, one bound to
        another address, or a Redis that does not answer in time.
        """
        if (parsed := _parsed(read_cookie(request.headers, DEVICE_COOKIE))) is None:
            return None
        account_id, token = parsed
        try:
            bound = await within(
                RECOGNISE_BUDGET_SECONDS,
                self._redis.get(device_key(account_id, token)),
            )
        except (RedisError, OSError, TimeoutError) as err:
            _LOGGER.warning("device not recognised: %s", type(err).__name__)
            return None
        if bound is None:
            return None
        if (bound.decode() if isinstance(bound, bytes) else bound) != address_key:
            return None
        return device_subject(account_id, token)

    async def remember(
        self, request: web.Request, account_id: str, address_key: str
    ) -> str:
        """Bind the request's device (or a new one) to the account for a year.

        A cookie of this account is kept and refreshed; any other is replaced.
        Returns the cookie value to send.
        """
        parsed = _parsed(read_cookie(request.headers, DEVICE_COOKIE))
        if parsed is None or parsed[0] != account_id:
            parsed = (account_id, secrets.token_urlsafe(32))
        token = parsed[1]
        await self._redis.set(
            device_key(account_id, token), address_key, ex=DEVICE_SECONDS
        )
        return f"{account_id}.{token}"


def set_device_cookie(
    response: web.StreamResponse, value: str, *, secure: bool
) -> None:
    """Send the device cookie: HttpOnly, SameSite=Lax, only to /api/auth, a year."""
    response.set_cookie(
        DEVICE_COOKIE,
        value,
        max_age=DEVICE_SECONDS,
        path=SIGNIN_PATH,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )
