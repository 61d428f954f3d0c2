"""Turn every failure into a clear answer: JSON under /api/, a page elsewhere."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from redis.exceptions import RedisError

from .representation import Representation

_LOGGER: Final = logging.getLogger(__name__)

_CODES: Final = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    500: "INTERNAL_ERROR",
}
# How long a client should wait when the store is unreachable.
UNAVAILABLE_RETRY_AFTER: Final = "5"
# Headers of an aiohttp HTTPException that the client needs (405's Allow, for one).
_KEPT: Final = (hdrs.ALLOW, hdrs.RETRY_AFTER)


class ApiError(Exception):
    """A domain failure with its HTTP status and public error code."""

    def __init__(
        self,
        status: int,
        code: str,
        /,
        *,
        headers: Mapping[str, str] | None = None,
        content_type: str = "application/json",
        **fields: Any,
    ) -> None:
        super().__init__(code)
        self.status = status
        self.code = code
        self.headers = dict(headers or {})
        self.content_type = content_type
        self.fields = fields


def error_code(status: int) -> str:
    """Name the error code of a status we did not raise ourselves."""
    return _CODES.get(status) or HTTPStatus(status).name


def json_error(
    status_code: int,
    code: str,
    headers: Mapping[str, str] | None = None,
    content_type: str = "application/json",
    /,
    **fields: Any,
) -> web.Response:
    """Answer {"error": CODE, ...} with no caching."""
    return web.Response(
        status=status_code,
        body=json.dumps({**fields, "error": code}).encode(),
        content_type=content_type,
        headers={hdrs.CACHE_CONTROL: "no-store", **(headers or {})},
    )


def setup_errors(app: web.Application) -> None:
    """Answer every exception below this middleware as {"error": CODE}."""

    @web.middleware
    async def errors_middleware(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Map ApiError, HTTP errors and crashes to JSON; log crashes."""
        try:
            return await handler(request)
        except ApiError as err:
            return json_error(
                err.status, err.code, err.headers, err.content_type, **err.fields
            )
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kept = {
                str(name): exc.headers[name] for name in _KEPT if name in exc.headers
            }
            return json_error(exc.status, error_code(exc.status), kept)
        except (RedisError, OSError, TimeoutError) as err:
            # The store is down or slow: fail closed, say so, and say when to retry.
            _LOGGER.warning(
                "store unavailable on %s %s: %s",
                request.method,
                request.rel_url.path,
                type(err).__name__,
            )
            return json_error(
                503, "UNAVAILABLE", {"Retry-After": UNAVAILABLE_RETRY_AFTER}
            )
        except Exception:
            _LOGGER.exception(
                "Unhandled error on %s %s", request.method, request.rel_url.path
            )
            return json_error(500, _CODES[500])

    app.middlewares.append(errors_middleware)


def fallback_handler(
    pages: Mapping[int, Representation], public_paths: frozenset[str]
) -> Handler:
    """Answer what no public route took: 405 on a public path, else a 404 page."""
    allow = {"Allow": "GET,HEAD"}

    async def fallback(request: web.Request) -> web.StreamResponse:
        if request.path == "/api":
            return json_error(404, _CODES[404])
        if request.path in public_paths:
            page = pages[405]
            headers: dict[str, str] = {**page.headers, **allow}
            return web.Response(status=405, body=page.body, headers=headers)
        page = pages[404]
        return web.Response(status=404, body=page.body, headers=page.headers)

    return fallback
