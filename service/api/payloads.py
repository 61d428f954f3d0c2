"""Read JSON request bodies strictly: the right type, the right fields, nothing else."""

from __future__ import annotations

import json
from collections.abc import Set
from typing import Any

from aiohttp import web

from .errors import ApiError


async def read_json(
    request: web.Request, *, required: Set[str], optional: Set[str] = frozenset()
) -> dict[str, Any]:
    """Return the JSON object of the body, or raise 415/413/400."""
    if request.content_type != "application/json":
        raise ApiError(415, "UNSUPPORTED_MEDIA_TYPE")
    raw = await request.read()  # over client_max_size: aiohttp raises 413
    try:
        data = json.loads(raw)
    except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, "BAD_REQUEST") from err
    if not isinstance(data, dict):
        raise ApiError(400, "BAD_REQUEST")
    keys = set(data)
    if not required <= keys or not keys <= (required | optional):
        raise ApiError(400, "BAD_REQUEST")
    return data


def json_response(data: Any, *, status: int = 200) -> web.Response:
    """Answer JSON that no cache may keep."""
    return web.Response(
        status=status,
        body=json.dumps(data, ensure_ascii=False).encode(),
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )
