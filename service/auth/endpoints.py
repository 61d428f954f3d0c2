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
from ..keys import CONTENT, REDIS, SETTINGS
from ..limits.http import enforce, refund
from ..moderation.suspension import AccountSuspended, refuse_if_address_suspended
from ..store.deadline import within
from .binding import (
    binding_of,
    clear_signin_cookie,
    new_binding,
    set_confirm_cookie,
    set_signin_cookie,
)
from .challenge import charge, give_back, screen
from .codes import CODE_TTL_SECONDS, Verdict
from .cookies import read_cookie
from .devices import set_device_cookie
from .identity import parse_address
from .keys import ACCOUNTS, CODES, DEVICES, RETURNING
from .mailer import MAILER, Lang, MailUnavailable, code_message, site_name
from .sessions import (
    COOKIE,
    SESSION,
    SESSIONS,
    anonymous,
    clear_session_cookie,
    set_session_cookie,
)

_LOGGER: Final = logging.getLogger(__name__)
RESEND_AFTER_SECONDS: Final = 60
MAIL_RETRY_AFTER: Final = "30"
_MAX_CODE_INPUT: Final = 64
# Signing out waits this long for Redis, then clears the cookie regardless.
LOGOUT_BUDGET_SECONDS: Final = 1.0
# A code request's buckets: the address's, for anyone (anonymous); the device's,
# for a browser that signed in with this address before.
ANONYMOUS_POLICIES: Final = ("code-cooldown", "code-email-hour", "code-email-day")
DEVICE_POLICIES: Final = (
    "code-device-cooldown",
    "code-device-hour",
    "code-device-day",
)


@anonymous
async def request_code(request: web.Request) -> web.StreamResponse:
    """Mail a code; the answer is the same for new and known addresses."""
    app = request.app
    settings = app[SETTINGS]
    body = await read_json(request, required={"email"}, optional={"lang", "altcha"})
    lang = body.get("lang", "zh")
    if lang not in ("zh", "en"):
        raise ApiError(400, "BAD_REQUEST")
    address = parse_address(body["email"], settings.secret_key)
    # Proof of work first, when the mail budget or the network asks for it: a
    # request without it touches nothing of the address (service/auth/challenge).
    admission = await screen(request, body.get("altcha"))
    # Per address (cooldown, hour, day) only once it is valid, then the global
    # budget. A browser that signed in with this address before (studio_device)
    # is charged its own buckets instead of the address's anonymous ones.
    limits = settings.limits
    if device := await app[DEVICES].recognise(request, address.key):
        address_subject, names = device, DEVICE_POLICIES
    else:
        address_subject, names = f"em:{address.key}", ANONYMOUS_POLICIES
    per_address = [limits[n] for n in names]
    # The code belongs to the requester's binding; a resend replaces only its own.
    binding = binding_of(request) or new_binding()
    await enforce(request, address_subject, per_address, fail_open=False)
    codes = app[CODES]
    try:
        await charge(request, admission)  # the network's and the mail budget's
        code, digest = await codes.issue(address.key, binding)
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
            await codes.withdraw(address.key, binding, digest)
        await refund(request, address_subject, per_address)
        await give_back(request, admission)
        _LOGGER.error("code not delivered (address %s), withdrawn", address.key[:12])
        raise ApiError(
            503, "MAIL_UNAVAILABLE", headers={"Retry-After": MAIL_RETRY_AFTER}
        ) from err
    _LOGGER.info("code sent (address %s)", address.key[:12])
    response = json_response(
        {
            "ok": True,
            "expires_in": CODE_TTL_SECONDS,
            "resend_after": RESEND_AFTER_SECONDS,
        }
    )
    set_signin_cookie(response, binding, secure=settings.https)
    if read_cookie(request.headers, COOKIE):
        # Signed in: the code may be for "delete my account", which needs the
        # binding too (the sign-in cookie itself only goes to /api/auth).
        set_confirm_cookie(response, binding, secure=settings.https)
    return response


@anonymous
async def verify(request: web.Request) -> web.StreamResponse:
    """Spend the code; the first verify of an address opens its account."""
    app = request.app
    settings = app[SETTINGS]
    body = await read_json(request, required={"email", "code"})
    submitted = body["code"]
    if not isinstance(submitted, str) or len(submitted) > _MAX_CODE_INPUT:
        raise ApiError(400, "BAD_REQUEST")
    address = parse_address(body["email"], settings.secret_key)
    # Only the binding that asked for the code may spend its attempts; without
    # one there is nothing to spend (and no one else's attempts are touched).
    binding = binding_of(request)
    verdict = (
        await app[CODES].verify(address.key, binding, submitted)
        if binding
        else Verdict.NO_CODE
    )
    _LOGGER.info("verify %s (address %s)", verdict.value, address.key[:12])
    if verdict is Verdict.BURNED:
        raise ApiError(400, "CODE_EXPIRED_REQUEST_NEW")
    if verdict is not Verdict.OK:
        raise ApiError(400, "INVALID_CODE")
    sessions = app[SESSIONS]
    # First: a suspended address neither restores a deletion nor opens an account.
    try:
        keys = app[ACCOUNTS].address_keys(address.email)
        await refuse_if_address_suspended(app[REDIS], keys)
    except AccountSuspended as err:
        _LOGGER.info("sign-in refused: address %s is suspended", address.key[:12])
        raise ApiError(403, "ACCOUNT_SUSPENDED", until=err.until) from None
    # Within its grace period a deleted account comes back whole; past it, the
    # address is let go of and opens a new account (without trial credits).
    restored = await app[RETURNING].on_sign_in(address.email)
    account, opened = await app[ACCOUNTS].open(address.email)
    if previous := read_cookie(request.headers, COOKIE):
        await sessions.delete(previous)
    try:
        token, session = await sessions.create(account.id)
    except AccountSuspended as err:
        _LOGGER.info("sign-in refused: account %s is suspended", account.id)
        raise ApiError(403, "ACCOUNT_SUSPENDED", until=err.until) from None
    _LOGGER.info(
        "signed in account %s, session %s, new=%s",
        account.id,
        session.key[16:24],
        opened,
    )
    response = json_response(
        {"user": account.public(), "new_account": opened, "restored": restored}
    )
    set_session_cookie(response, token, secure=settings.https)
    clear_signin_cookie(response, secure=settings.https)
    # The device cookie only spares a quota: signing in does not wait on it failing.
    try:
        device = await app[DEVICES].remember(request, account.id, address.key)
    except (RedisError, OSError, TimeoutError) as err:
        _LOGGER.warning("device not remembered: %s", type(err).__name__)
    else:
        set_device_cookie(response, device, secure=settings.https)
    return response


@anonymous
async def logout(request: web.Request) -> web.StreamResponse:
    """End the session the request carries, if any, and clear the cookie.

    The browser's cookie is cleared even when Redis cannot be reached: the
    answer is then 503, and the session ends at its own expiry at the latest.
    """
    secure = request.app[SETTINGS].https
    if token := read_cookie(request.headers, COOKIE):
        try:
            await within(LOGOUT_BUDGET_SECONDS, request.app[SESSIONS].delete(token))
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
    ended = await request.app[SESSIONS].end_all(request[SESSION].account_id)
    _LOGGER.info("signed out everywhere: %d sessions", ended)
    response = web.Response(status=204, headers={"Cache-Control": "no-store"})
    clear_session_cookie(response, secure=request.app[SETTINGS].https)
    return response


async def me(request: web.Request) -> web.StreamResponse:
    """Show the signed-in account."""
    session = request[SESSION]
    account = await request.app[ACCOUNTS].load(session.account_id)
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
