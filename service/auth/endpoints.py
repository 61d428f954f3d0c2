"""Sign-in by e-mail code: request a code, verify it, sign out, and who am I."""

from __future__ import annotations

import logging
from contextlib import suppress
from typing import Final, cast

from aiohttp import web
from redis.exceptions import RedisError

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_json
from ..keys import ACCOUNTS, CODES, CONTENT, MAILER, SESSION, SESSIONS, SETTINGS
from ..limits.http import enforce, refund
from ..store.deadline import within
from .codes import CODE_TTL_SECONDS, Verdict
from .cookies import read_cookie
from .identity import parse_address
from .mailer import Lang, MailUnavailable, code_message, site_name
from .sessions import COOKIE, anonymous, clear_session_cookie, set_session_cookie

_LOGGER: Final = logging.getLogger(__name__)
RESEND_AFTER_SECONDS: Final = 60
MAIL_RETRY_AFTER: Final = "30"
_MAX_CODE_INPUT: Final = 64
# Signing out waits this long for Redis, then clears the cookie regardless.
LOGOUT_BUDGET_SECONDS: Final = 1.0


@anonymous
async def request_code(request: web.Request) -> web.StreamResponse:
    """Mail a code; the answer is the same for new and known addresses."""
    app = request.config_dict
    settings = app[SETTINGS]
    body = await read_json(request, required={"email"}, optional={"lang"})
    lang = body.get("lang", "zh")
    if lang not in ("zh", "en"):
        raise ApiError(400, "BAD_REQUEST")
    address = parse_address(body["email"], settings.secret_key)
    # Per address (cooldown, hour, day) only once it is valid, then the global budget.
    limits = settings.limits
    per_address = [
        limits[n] for n in ("code-cooldown", "code-email-hour", "code-email-day")
    ]
    address_subject = f"em:{address.key}"
    mail_budget = [limits["mail-global"]]
    await enforce(request, address_subject, per_address, fail_open=False)
    codes = app[CODES]
    try:
        await enforce(request, "all", mail_budget, fail_open=False)
        code, digest = await codes.issue(address.key)
    except (ApiError, RedisError, OSError, TimeoutError):
        # No mail will go out: the address's tokens go back before the error does.
        await refund(request, address_subject, per_address)
        raise
    message = code_message(
        to=address.mail_to,
        code=code,
        lang=cast(Lang, lang),
        site_name=site_name(app[CONTENT].site, cast(Lang, lang)),
        sender=settings.mail_from,
    )
    try:
        await app[MAILER].send(message)
    except MailUnavailable as err:
        # Nothing was sent: the code must not stay valid, and the address (and the
        # mail budget) may try again at once.
        with suppress(RedisError, OSError, TimeoutError):
            await codes.withdraw(address.key, digest)
        await refund(request, address_subject, per_address)
        await refund(request, "all", mail_budget)
        _LOGGER.error("code not delivered (address %s), withdrawn", address.key[:12])
        raise ApiError(
            503, "MAIL_UNAVAILABLE", headers={"Retry-After": MAIL_RETRY_AFTER}
        ) from err
    _LOGGER.info("code sent (address %s)", address.key[:12])
    return json_response(
        {
            "ok": True,
            "expires_in": CODE_TTL_SECONDS,
            "resend_after": RESEND_AFTER_SECONDS,
        }
    )


@anonymous
async def verify(request: web.Request) -> web.StreamResponse:
    """Spend the code; the first verify of an address opens its account."""
    app = request.config_dict
    settings = app[SETTINGS]
    body = await read_json(request, required={"email", "code"})
    submitted = body["code"]
    if not isinstance(submitted, str) or len(submitted) > _MAX_CODE_INPUT:
        raise ApiError(400, "BAD_REQUEST")
    address = parse_address(body["email"], settings.secret_key)
    verdict = await app[CODES].verify(address.key, submitted)
    _LOGGER.info("verify %s (address %s)", verdict.value, address.key[:12])
    if verdict is Verdict.BURNED:
        raise ApiError(400, "CODE_EXPIRED_REQUEST_NEW")
    if verdict is not Verdict.OK:
        raise ApiError(400, "INVALID_CODE")
    account, opened = await app[ACCOUNTS].open(address.key, address.email)
    sessions = app[SESSIONS]
    if previous := read_cookie(request.headers, COOKIE):
        await sessions.delete(previous)
    token, session = await sessions.create(account.id)
    _LOGGER.info(
        "signed in account %s, session %s, new=%s",
        account.id,
        session.key[16:24],
        opened,
    )
    response = json_response({"user": account.public(), "new_account": opened})
    set_session_cookie(response, token, secure=settings.https)
    return response


@anonymous
async def logout(request: web.Request) -> web.StreamResponse:
    """End the session the request carries, if any, and clear the cookie.

    The browser's cookie is cleared even when Redis cannot be reached: the
    answer is then 503, and the session ends at its own expiry at the latest.
    """
    secure = request.config_dict[SETTINGS].https
    if token := read_cookie(request.headers, COOKIE):
        try:
            await within(
                LOGOUT_BUDGET_SECONDS, request.config_dict[SESSIONS].delete(token)
            )
        except (RedisError, OSError, TimeoutError):
            cleared = web.Response()
            clear_session_cookie(cleared, secure=secure)
            raise ApiError(
                503,
                "UNAVAILABLE",
                headers={
                    "Retry-After": "5",
                    "Set-Cookie": cleared.cookies[COOKIE].OutputString(),
                },
            ) from None
    response = web.Response(status=204, headers={"Cache-Control": "no-store"})
    clear_session_cookie(response, secure=secure)
    return response


async def logout_everywhere(request: web.Request) -> web.StreamResponse:
    """End every session of my account, this one included, and their streams."""
    ended = await request.config_dict[SESSIONS].end_all(request[SESSION].account_id)
    _LOGGER.info("signed out everywhere: %d sessions", ended)
    response = web.Response(status=204, headers={"Cache-Control": "no-store"})
    clear_session_cookie(response, secure=request.config_dict[SETTINGS].https)
    return response


async def me(request: web.Request) -> web.StreamResponse:
    """Show the signed-in account."""
    session = request[SESSION]
    account = await request.config_dict[ACCOUNTS].load(session.account_id)
    if account is None:
        raise ApiError(401, "NO_SESSION")
    return json_response(account.public())


def setup_auth_routes(api: ApiBoundary) -> None:
    """Register the sign-in endpoints and /me behind the /api boundary."""
    api.add_routes(
        [
            web.post("/auth/code", request_code, name="auth_code"),
            web.post("/auth/verify", verify, name="auth_verify"),
            web.post("/auth/logout", logout, name="auth_logout"),
            web.post(
                "/auth/logout-everywhere", logout_everywhere, name="auth_logout_all"
            ),
            web.get("/me", me, name="me"),
        ]
    )
