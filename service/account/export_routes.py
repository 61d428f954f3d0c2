"""Export my data over /api: ask for it, follow it, download it (the owner only)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Final

from aiohttp import hdrs, web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response
from ..auth.sessions import SESSION
from ..keys import REDIS, SETTINGS
from ..limits.http import PROBLEM_TYPE, enforce, refund
from ..studio.context import EMBEDDED_WORKER
from ..studio.keys import MEDIA
from ..studio.media.store import MissingMedia
from ..web.keys import SECURITY
from .exports import ExportJobs, ExportRefused, ExportStore, ExportTooSoon, view
from .keys import EXPORTS

# Routes whose handlers charge a per-account limit (headers on every answer).
EXPORT_LIMITED: Final = frozenset({"account_export"})
_EID: Final = re.compile(r"[0-9a-f]{24}")


def _me(request: web.Request) -> str:
    return request[SESSION].account_id


def _too_soon(retry_after: int) -> ApiError:
    """Answer as the limiter does: an export of the last 24 hours still stands."""
    return ApiError(
        429,
        "RATE_LIMITED",
        headers={hdrs.RETRY_AFTER: str(retry_after)},
        content_type="application/problem+json",
        type=PROBLEM_TYPE,
        title="Too Many Requests",
        status=429,
        detail=f"Rate limit exceeded. Retry in {retry_after} seconds.",
        **{"violated-policies": ["export"]},
        retry_after=retry_after,
    )


async def request_export(request: web.Request) -> web.StreamResponse:
    """Ask for a ZIP of everything of mine; a worker builds it (one a day)."""
    app = request.app
    account = _me(request)
    policies = [app[SETTINGS].limits["export"]]
    await enforce(request, f"acct:{account}", policies, fail_open=False)
    try:
        fields = await app[EXPORTS].request(account)
    except ExportTooSoon as err:
        raise _too_soon(err.retry_after) from None
    except ExportRefused as err:
        await refund(request, f"acct:{account}", policies)  # nothing was made
        if err.code == "ACCOUNT_DELETING":
            raise ApiError(409, err.code) from None
        raise ApiError(401, "NO_SESSION") from None  # the account is gone
    return json_response({"id": fields["id"], "status": "pending"}, status=202)


async def _mine(request: web.Request) -> dict[str, str]:
    eid = request.match_info["eid"]
    if not _EID.fullmatch(eid):
        raise ApiError(404, "NOT_FOUND")
    fields = await request.app[EXPORTS].get(_me(request), eid)
    if fields is None:
        raise ApiError(404, "NOT_FOUND")
    return fields


async def get_export(request: web.Request) -> web.StreamResponse:
    """Show how my export stands; anyone else's is as absent as a missing one."""
    return json_response(view(await _mine(request)))


async def download(request: web.Request) -> web.StreamResponse:
    """Stream my ready export, never cached, for its 24 hours; then 404."""
    app = request.app
    fields = await _mine(request)
    if fields["status"] != "ready":
        raise ApiError(404, "NOT_FOUND")
    chunks = app[MEDIA].chunks(fields["key"])
    try:
        try:
            first = await anext(chunks)
        except MissingMedia:
            raise ApiError(404, "NOT_FOUND") from None
        except StopAsyncIteration:
            first = b""
        day = fields["created_at"][:10]
        response = web.StreamResponse(
            headers={
                **app[SECURITY].common,
                hdrs.CONTENT_TYPE: "application/zip",
                hdrs.CACHE_CONTROL: "private, no-store",
                hdrs.CONTENT_DISPOSITION: (
                    f'attachment; filename="studio-export-{day}.zip"'
                ),
            }
        )
        await response.prepare(request)
        if request.method == hdrs.METH_HEAD:  # the headers only: no body follows
            await response.write_eof()
            return response
        with contextlib.suppress(ConnectionResetError):
            await response.write(first)
            async for chunk in chunks:
                await response.write(chunk)
            await response.write_eof()
        return response
    finally:
        if isinstance(chunks, AsyncGenerator):
            await chunks.aclose()


async def exports_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the app its export store; build exports in `make run`'s own worker."""
    redis = app[REDIS]
    app[EXPORTS] = ExportStore(redis)
    if not app.get(EMBEDDED_WORKER, False):
        yield
        return
    settings = app[SETTINGS]
    jobs = ExportJobs(
        redis,
        app[MEDIA],
        lease_seconds=settings.workbench.visibility_timeout,
        privacy_url=f"{settings.base_url}/privacy",
    )
    stop = asyncio.Event()
    task = asyncio.create_task(jobs.run(stop), name="exports")
    yield
    stop.set()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def setup_export_routes(api: ApiBoundary) -> None:
    """Register the export endpoints behind the /api boundary (session-only)."""
    api.add_routes(
        [
            web.post("/account/export", request_export, name="account_export"),
            web.get("/account/exports/{eid}", get_export, name="account_export_get"),
            web.get(
                "/account/exports/{eid}/file", download, name="account_export_file"
            ),
        ]
    )
