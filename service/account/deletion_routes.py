"""POST /api/account/delete: a fresh code for my own address ends my account now."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Final

from aiohttp import web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_json
from ..auth.binding import CONFIRM_PATH, binding_of, clear_signin_cookie
from ..auth.codes import Verdict
from ..auth.identity import address_key
from ..auth.keys import ACCOUNTS, CODES
from ..auth.sessions import SESSION, SESSIONS, clear_session_cookie
from ..keys import REDIS, SETTINGS
from ..square.feed import SQUARE
from ..studio.context import EMBEDDED_WORKER
from ..studio.keys import GENERATIONS, JOBS, MEDIA, WORKS
from ..studio.ledger import UnknownAccount, iso
from .deletion import DeletionStore
from .keys import DELETIONS

_LOGGER: Final = logging.getLogger(__name__)
_MAX_CODE_INPUT: Final = 64


async def delete_account(request: web.Request) -> web.StreamResponse:
    """Spend a code mailed to my address (with its binding), then delete my account.

    The code is checked exactly as /api/auth/verify checks it: one attempt
    counted per try, the binding's own code only, any failure INVALID_CODE.
    """
    app = request.app
    settings = app[SETTINGS]
    body = await read_json(request, required={"code"})
    submitted = body["code"]
    if not isinstance(submitted, str) or len(submitted) > _MAX_CODE_INPUT:
        raise ApiError(400, "BAD_REQUEST")
    me = request[SESSION].account_id
    account = await app[ACCOUNTS].load(me)
    if account is None:
        raise ApiError(401, "NO_SESSION")
    binding = binding_of(request)
    key = address_key(account.email, settings.secret_key)
    verdict = (
        await app[CODES].verify(key, binding, submitted) if binding else Verdict.NO_CODE
    )
    _LOGGER.info("delete: code %s (account %s)", verdict.value, me)
    if verdict is not Verdict.OK:
        raise ApiError(400, "INVALID_CODE")
    try:
        deleted = await app[DELETIONS].delete(me)
    except UnknownAccount:
        raise ApiError(401, "NO_SESSION") from None
    response = json_response({"purge_at": iso_epoch(deleted.purge_at)}, status=202)
    clear_session_cookie(response, secure=settings.https)
    clear_signin_cookie(response, secure=settings.https, path=CONFIRM_PATH)
    return response


def iso_epoch(epoch: int) -> str:
    """Write an epoch as RFC 3339 UTC with a Z, like every other `_at`."""
    return iso(dt.datetime.fromtimestamp(epoch, dt.UTC))


async def deletions_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the app its deletion store; run the purger too in `make run`."""
    settings = app[SETTINGS]
    store = app[DELETIONS] = DeletionStore(
        app[REDIS],
        accounts=app[ACCOUNTS],
        sessions=app[SESSIONS],
        generations=app[GENERATIONS],
        jobs=app[JOBS],
        works=app[WORKS],
        square=app[SQUARE],
        media=app[MEDIA],
        grace_seconds=settings.account.grace_days * 86400,
    )
    if not app.get(EMBEDDED_WORKER, False):
        yield
        return
    from .purger import Purger  # here: `serve` never purges

    stop = asyncio.Event()
    purger = Purger(store, every=settings.account.purge_seconds)
    task = asyncio.create_task(purger.run(stop), name="purger")
    yield
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def setup_deletion_routes(api: ApiBoundary) -> None:
    """Register POST /api/account/delete behind the /api boundary (session only)."""
    api.add_routes([web.post("/account/delete", delete_account, name="account_delete")])
