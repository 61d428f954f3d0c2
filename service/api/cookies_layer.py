"""Refuse /api requests whose headers cost too much to read, before any reading."""

from __future__ import annotations

from aiohttp import hdrs, web
from aiohttp.http import HttpVersion11
from aiohttp.typedefs import Handler
from multidict import CIMultiDictProxy

from ..auth.cookies import MAX_COOKIE_HEADER_BYTES, cookie_header_size
from ..web.hardening import close_after_response
from .boundary import ApiBoundary
from .errors import ApiError, json_error


def _oversized(headers: CIMultiDictProxy[str]) -> bool:
    return hdrs.COOKIE in headers and (
        cookie_header_size(headers) > MAX_COOKIE_HEADER_BYTES
    )


def _unframed(request: web.BaseRequest) -> bool:
    return request.version < HttpVersion11 and hdrs.TRANSFER_ENCODING in request.headers


def bound_refuses(request: web.BaseRequest) -> bool:
    """Tell whether the bound below answers this request 400."""
    return _oversized(request.headers) or _unframed(request)


def setup_cookie_bound(api: ApiBoundary) -> None:
    """Answer 400 BAD_REQUEST to an oversized Cookie or an HTTP/1.0 chunked request.

    A Cookie header over 4 KB (CONTRACT §3) is refused before the session
    layer looks at it: no rate limit stands in front of the session check, and
    a crafted header must not cost more than a refusal. An HTTP/1.0 request
    with Transfer-Encoding has no trustworthy framing (RFC 9112 §6.1): a proxy
    in front may have read its body differently, so it is refused and its
    connection closed before any body is read.
    """

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        async def bounded(request: web.Request) -> web.StreamResponse:
            """Check the two headers; pass everything else through untouched."""
            if _oversized(request.headers):
                raise ApiError(400, "BAD_REQUEST")
            if _unframed(request):
                close_after_response(request)
                response = json_error(400, "BAD_REQUEST")
                response.force_close()
                return response
            return await handler(request)

        return bounded

    api.add_layer(layer)
