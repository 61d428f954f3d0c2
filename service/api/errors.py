"""Turn every failure into a clear answer: JSON under /api/, a page elsewhere."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from redis.exceptions import RedisClusterException, RedisError

from ..web.error_codes import ERROR_CODES, error_code
from ..web.headers import SecurityHeaders
from ..web.representation import Representation
from .boundary import API_PREFIX, ApiBoundary

_LOGGER: Final = logging.getLogger(__name__)

# How long a client should wait when the store is unreachable.
UNAVAILABLE_RETRY_AFTER: Final = "5"
# The name of the catch-all route that answers what no other route took.
FALLBACK: Final = "fallback"
# What the access log and metrics say of a request whose client left before
# its answer (nginx's "client closed request"); no client ever receives it.
CLIENT_CLOSED: Final = 499
# Headers of an aiohttp HTTPException that the client needs to act on it.
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


def client_gone(request: web.BaseRequest) -> bool:
    """Tell whether the request's connection has closed (the client left)."""
    transport = request.transport
    return transport is None or transport.is_closing()


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


def setup_errors(api: ApiBoundary) -> None:
    """Answer every exception of the layers below as {"error": CODE}."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        async def answered(request: web.Request) -> web.StreamResponse:
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
                    str(name): exc.headers[name]
                    for name in _KEPT
                    if name in exc.headers
                }
                return json_error(exc.status, error_code(exc.status), kept)
            except (RedisError, RedisClusterException, OSError, TimeoutError) as err:
                if isinstance(err, ConnectionResetError) and client_gone(request):
                    # The client left while its body was read: not the store's
                    # doing, and nobody to answer. Logged as nginx does: 499.
                    _LOGGER.info(
                        "client left during %s %s",
                        request.method,
                        request.rel_url.path,
                    )
                    return json_error(CLIENT_CLOSED, "CLIENT_CLOSED_REQUEST")
                # The store is down or slow (or a cluster slot has no master
                # yet): fail closed, say so, say when to retry.
                _LOGGER.warning(  # which timeout: the client's, or a budget's
                    "store unavailable on %s %s: %s.%s",
                    request.method,
                    request.rel_url.path,
                    type(err).__module__,
                    type(err).__name__,
                )
                return json_error(
                    503, "UNAVAILABLE", {"Retry-After": UNAVAILABLE_RETRY_AFTER}
                )
            except Exception:
                _LOGGER.exception(
                    "Unhandled error on %s %s", request.method, request.rel_url.path
                )
                return json_error(500, ERROR_CODES[500])

        return answered

    api.add_layer(layer)


async def _allowed_methods(request: web.Request) -> set[str]:
    """Collect the methods other routes would take on this path (cold path only)."""
    allowed: set[str] = set()
    for resource in request.app.router.resources():
        if resource.name != FALLBACK:
            allowed |= (await resource.resolve(request))[1]
    return allowed


# The paths only programs call: their misses are JSON like their errors.
JSON_PREFIXES: Final = (API_PREFIX + "/", "/webhooks/")


def fallback_handler(
    pages: Mapping[int, Representation], security: SecurityHeaders
) -> Handler:
    """Answer what no route took: 405 with Allow on a known path, else 404.

    Under /api and /webhooks (machines' paths) the answer is JSON; elsewhere it is
    a page a person can read.
    """
    json_headers = security.for_type("application/json")

    async def fallback(request: web.Request) -> web.StreamResponse:
        allowed = await _allowed_methods(request)
        extra = {"Allow": ",".join(sorted(allowed))} if allowed else {}
        status = 405 if allowed else 404
        path = request.path
        if path == API_PREFIX or path.startswith(JSON_PREFIXES):
            return json_error(status, ERROR_CODES[status], {**json_headers, **extra})
        page = pages[status]
        headers = {**page.headers, **extra}
        return web.Response(status=status, body=page.body, headers=headers)

    return fallback
