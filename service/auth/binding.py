"""The sign-in binding: a cookie that makes a code spendable only by its requester."""

from __future__ import annotations

import re
import secrets
from typing import Final

from aiohttp import hdrs, web

from .codes import CODE_TTL_SECONDS
from .cookies import read_cookie

SIGNIN_COOKIE: Final = "studio_signin"
# The cookie goes only to the sign-in endpoints, and lives as long as a code.
SIGNIN_PATH: Final = "/api/auth"
# A signed-in requester's copy of it goes to "delete my account" (CONTRACT §9).
CONFIRM_PATH: Final = "/api/account"
_TOKEN: Final = re.compile(r"[A-Za-z0-9_-]{43}")


def new_binding() -> str:
    """Draw a binding id: 32 random bytes, base64url without padding."""
    return secrets.token_urlsafe(32)


def binding_of(request: web.Request) -> str | None:
    """Return the request's well-formed binding id, or None."""
    value = read_cookie(request.headers, SIGNIN_COOKIE)
    return value if value and _TOKEN.fullmatch(value) else None


def set_signin_cookie(
    response: web.StreamResponse, binding: str, *, secure: bool
) -> None:
    """Send the binding: HttpOnly, SameSite=Lax, only to /api/auth, ten minutes."""
    response.set_cookie(
        SIGNIN_COOKIE,
        binding,
        max_age=CODE_TTL_SECONDS,
        path=SIGNIN_PATH,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )


def set_confirm_cookie(
    response: web.StreamResponse, binding: str, *, secure: bool
) -> None:
    """Send the binding to /api/account as well, as a raw second Set-Cookie.

    The cookie has the sign-in cookie's name and value, only its path differs;
    aiohttp keeps one cookie per name, so this one goes out as a header (ahead
    of the /api/auth one, which stays the last word for clients that keep one).
    """
    copy = web.Response()
    copy.set_cookie(
        SIGNIN_COOKIE,
        binding,
        max_age=CODE_TTL_SECONDS,
        path=CONFIRM_PATH,
        secure=secure,
        httponly=True,
        samesite="Lax",
    )
    response.headers.add(
        hdrs.SET_COOKIE, copy.cookies[SIGNIN_COOKIE].output(header="").strip()
    )


def clear_signin_cookie(
    response: web.StreamResponse, *, secure: bool, path: str = SIGNIN_PATH
) -> None:
    """Tell the browser to drop the binding once its code is spent."""
    response.del_cookie(
        SIGNIN_COOKIE, path=path, secure=secure, httponly=True, samesite="Lax"
    )
