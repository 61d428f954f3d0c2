"""The public error code of a status we did not raise ourselves: one table for the
/api boundary and for the answers aiohttp gives by itself (hardening.py)."""

from __future__ import annotations

from http import HTTPStatus
from typing import Final

ERROR_CODES: Final = {
    400: "BAD_REQUEST",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    500: "INTERNAL_ERROR",
}


def error_code(status: int) -> str:
    """Name the error code of a status we did not raise ourselves."""
    return ERROR_CODES.get(status) or HTTPStatus(status).name
