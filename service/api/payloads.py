"""Read JSON request bodies strictly: the right type, the right fields, nothing else."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Mapping, Set
from contextlib import asynccontextmanager
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from ..web.hardening import close_after_response
from ..web.representation import DirectResponse, json_head
from .codings import body_coding, decode_body
from .errors import ApiError

# A body must be whole this long after we start reading it (CONTRACT §3): a
# client trickling it would hold a connection and a task; it gets 408 instead.
JSON_READ_SECONDS: Final = 10.0
UPLOAD_READ_SECONDS: Final = 120.0
# The answer to a body that came too slowly closes its connection.
CLOSE: Final = {"Connection": "close"}


# A `\uD800`-`\uDFFF` escape: the only way a lone surrogate gets past UTF-8.
_ESCAPED_SURROGATE: Final = re.compile(rb"\\u[dD][89abcdefABCDEF]")
_SURROGATE: Final = re.compile("[\ud800-\udfff]")


def _not_json(constant: str) -> Any:
    """Refuse NaN and Infinity: Python reads them, RFC 8259 has no such values."""
    raise ValueError(f"{constant} is not JSON")


# json.loads with a keyword builds a decoder per call: this one is built once.
_DECODER: Final = json.JSONDecoder(parse_constant=_not_json)


@asynccontextmanager
async def body_deadline(request: web.Request, seconds: float) -> AsyncIterator[None]:
    """Give the body `seconds` to arrive, else answer 408 and close the connection."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        close_after_response(request)
        raise ApiError(408, "REQUEST_TIMEOUT", headers=CLOSE) from None


async def read_json(
    request: web.Request,
    *,
    required: Set[str],
    optional: Set[str] = frozenset(),
    name_field: bool = False,
) -> dict[str, Any]:
    """Return the JSON object of the body, or raise 415/413/408/400.

    With `name_field`, a missing or unknown key is named in the 400's `field`.
    """
    if request.content_type != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE")
    coding = body_coding(request)
    try:
        if request.content.is_eof():  # all here already: no wait, no timer
            raw = await request.read()
        else:
            async with body_deadline(request, JSON_READ_SECONDS):
                raw = await request.read()  # over client_max_size: raises 413
    except RequestPayloadError:  # broken framing, e.g. a bad chunk: no echo of it
        raise ApiError(400, "BAD_REQUEST") from None
    raw = decode_body(raw, coding, request.client_max_size)
    try:
        text = raw.decode()  # strict UTF-8 (RFC 8259): encoded surrogates fail here
        data = _DECODER.decode(text)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, "BAD_REQUEST") from err
    if may_hold_surrogates(raw):  # rare: only then walk what was decoded
        _refuse_lone_surrogates(data, required | optional)
    if not isinstance(data, dict):
        raise ApiError(400, "BAD_REQUEST")
    keys = set(data)
    if not required <= keys or not keys <= (required | optional):
        if not name_field:
            raise ApiError(400, "BAD_REQUEST")
        wrong = sorted((keys - required - optional) | (required - keys))
        raise ApiError(400, "BAD_REQUEST", field=wrong[0])
    return data


def may_hold_surrogates(raw: bytes) -> bool:
    """Tell whether a body escapes a surrogate; cheap on the bodies browsers send.

    A body without a backslash (most: browsers escape no letter) is told by
    one memchr, well under a µs for 16 KiB; one with escapes costs a regex scan,
    about json.loads' own time when every character is escaped.
    """
    return b"\\" in raw and _ESCAPED_SURROGATE.search(raw) is not None


def _refuse_lone_surrogates(data: Any, fields: Set[str]) -> None:
    """Refuse a lone surrogate in any key or string: nothing could store or echo it.

    JSON decodes an escaped pair to one character, so any surrogate left is
    alone. The 400 names the top-level field it is under, when it is a field.
    """
    for key, value in data.items() if isinstance(data, dict) else ():
        pending = [key, value]
        while pending:
            item = pending.pop()
            if isinstance(item, str):
                if _SURROGATE.search(item):
                    if key in fields:
                        raise ApiError(400, "BAD_REQUEST", field=key)
                    raise ApiError(400, "BAD_REQUEST")
            elif isinstance(item, dict):
                pending += [*item.keys(), *item.values()]
            elif isinstance(item, list):
                pending += item


_NO_STORE_JSON: Final = json_head("no-store")
# One encoder for every answer: json.dumps with an option builds one a call.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False)


def json_response(data: Any, *, status: int = 200) -> web.Response:
    """Answer JSON that no cache may keep."""
    body = _ENCODER.encode(data).encode()
    return DirectResponse(status=status, body=body, headers=_NO_STORE_JSON)


_IDEMPOTENCY_KEY: Final = re.compile(r"[\x21-\x7e]{1,255}")


def read_idempotency(request: web.Request, body: Mapping[str, Any]) -> tuple[str, str]:
    """Read `Idempotency-Key` ("" when absent) and hash the body it must repeat.

    A replay is the same key with the same body: the hash is of the body's
    canonical JSON, so key order and spacing do not matter. Without a key
    there is nothing to repeat, and no hash ("").
    """
    key = request.headers.get("Idempotency-Key")
    if key is None:
        return "", ""
    if not _IDEMPOTENCY_KEY.fullmatch(key):
        raise ApiError(400, "BAD_REQUEST", field="Idempotency-Key")
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return key, hashlib.sha256(canonical.encode()).hexdigest()
