"""Request bodies come plain, gzip or deflate; any other coding is refused.

aiohttp would decompress bodies itself, but it fails on a coding it cannot
decode (br, zstd) while parsing the headers, with a plain-text 400 that names
a missing library, and on a body that does not decompress with an ERROR and a
traceback once the answer is out. So the app turns that off (`handler_args`
in `create_app`) and the readers of bodies decode here, answering first.
"""

from __future__ import annotations

import zlib
from typing import Final

from aiohttp import hdrs, web

from .errors import ApiError

TAKEN: Final = frozenset({"gzip", "deflate"})


def body_coding(request: web.BaseRequest, taken: frozenset[str] = TAKEN) -> str:
    """Return the body's content coding ("" for none), or answer 415."""
    codings = [
        coding
        for value in request.headers.getall(hdrs.CONTENT_ENCODING, ())
        for part in value.split(",")
        if (coding := part.strip().lower()) not in ("", "identity")
    ]
    if not codings:
        return ""
    if len(codings) > 1 or codings[0] not in taken:
        raise ApiError(415, "UNSUPPORTED_ENCODING")
    return codings[0]


def decode_body(raw: bytes, coding: str, limit: int) -> bytes:
    """Undo the body's coding, into at most `limit` bytes; 400 if it does not decode."""
    if not coding:
        return raw
    if coding == "gzip":
        wbits = 16 + zlib.MAX_WBITS
    else:  # deflate is zlib-wrapped (RFC 9110); some clients send it bare
        wbits = zlib.MAX_WBITS if raw[:1] and raw[0] & 0x0F == 8 else -zlib.MAX_WBITS
    decompressor = zlib.decompressobj(wbits)
    try:
        body = decompressor.decompress(raw, limit + 1)
    except zlib.error:
        raise ApiError(400, "BAD_REQUEST") from None
    if len(body) > limit:
        raise ApiError(413, "PAYLOAD_TOO_LARGE")
    if not decompressor.eof or decompressor.unused_data:  # cut short, or trailing
        raise ApiError(400, "BAD_REQUEST")
    return body
