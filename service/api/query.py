"""Read query parameters strictly: known names once each, numbers in bounds."""

from __future__ import annotations

from typing import Final

from multidict import MultiMapping

from .errors import ApiError

DEFAULT_LIMIT: Final = 20
MAX_LIMIT: Final = 50
# Longer digit strings are refused before int(): it costs time quadratic in the
# length and refuses outright over 4,300 digits; no bound of ours is that long.
MAX_DIGITS: Final = 18


def bad_field(name: str) -> ApiError:
    """Name the field a request got wrong."""
    return ApiError(400, "BAD_REQUEST", field=name)


def read_number(raw: str, field: str, *, low: int, high: int) -> int:
    """Read a decimal number of ASCII digits within [low, high], or refuse it."""
    if not (raw.isascii() and raw.isdigit()) or len(raw) > MAX_DIGITS:
        raise bad_field(field)
    value = int(raw)
    if not low <= value <= high:
        raise bad_field(field)
    return value


def read_limit(raw: str | None) -> int:
    """Read `limit` (1-50, 20 when absent)."""
    if raw is None:
        return DEFAULT_LIMIT
    return read_number(raw, "limit", low=1, high=MAX_LIMIT)


def list_params(query: MultiMapping[str], allowed: frozenset[str]) -> tuple[int, str]:
    """Read `limit` and `cursor` strictly; refuse any other or repeated parameter."""
    for name in query:
        if name not in allowed | {"limit", "cursor"}:
            raise bad_field(name)
    if len(query) != len(set(query)):
        raise bad_field(next(n for n in query if len(query.getall(n)) > 1))
    return read_limit(query.get("limit")), query.get("cursor", "")


def read_cursor(cursor: str, prefix: str) -> int | None:
    """Read a cursor given earlier (`<prefix><n>`), or refuse it."""
    if not cursor:
        return None
    number = cursor.removeprefix(prefix)
    if number == cursor:
        raise bad_field("cursor")
    return read_number(number, "cursor", low=1, high=10**MAX_DIGITS - 1)
