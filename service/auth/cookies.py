"""Read one cookie out of the Cookie header without parsing the whole header.

aiohttp's `Request.cookies` turns every pair of the header into a Morsel: an
8 KB header of `a;` pairs costs over 10 ms of CPU, and no rate limit stands in
front of the session check. We only ever need our own cookies, so this finds
the one pair asked for with `str.find`, in time linear in the header's length
and with no object per pair, and the /api boundary refuses headers over
`MAX_COOKIE_HEADER_BYTES` before anything reads them.
"""

from __future__ import annotations

from typing import Final

from aiohttp import hdrs
from multidict import CIMultiDictProxy

# Browsers keep each cookie under 4 KB; ours are a few dozen bytes. A longer
# Cookie header on /api is refused with 400 before any parsing.
MAX_COOKIE_HEADER_BYTES: Final = 4096
# Longer values of our own cookies are garbage: reported as present but empty.
MAX_VALUE_CHARS: Final = 256
_BLANK: Final = " \t"


def cookie_header_size(headers: CIMultiDictProxy[str]) -> int:
    """Return the size in bytes of all Cookie headers together (0 without one)."""
    values = headers.getall(hdrs.COOKIE, ())
    size = 0
    for value in values:
        size += len(value) if value.isascii() else len(value.encode("utf-8", "replace"))
    # Several Cookie headers are joined with "; " (RFC 9113 §8.2.3).
    return size + 2 * max(0, len(values) - 1)


def find_cookie(header: str, name: str) -> str | None:
    """Return the value of the first `name=` pair of a Cookie header, or None.

    Pairs are separated by ";" and optional blanks; a value in double quotes
    loses them; a value over `MAX_VALUE_CHARS` comes back as "" (present but
    unusable, so the caller can clear it).
    """
    prefix = name + "="
    start = header.find(prefix)
    while start != -1:
        before = start
        while before and header[before - 1] in _BLANK:
            before -= 1
        if before == 0 or header[before - 1] == ";":
            begin = start + len(prefix)
            end = header.find(";", begin)
            value = (header[begin:] if end == -1 else header[begin:end]).strip(_BLANK)
            if len(value) > MAX_VALUE_CHARS:
                return ""
            if len(value) >= 2 and value[0] == value[-1] == '"':
                value = value[1:-1]
            return value
        start = header.find(prefix, start + 1)
    return None


def read_cookie(headers: CIMultiDictProxy[str], name: str) -> str | None:
    """Return the value of our cookie `name` in a request's headers, or None."""
    for header in headers.getall(hdrs.COOKIE, ()):
        if (value := find_cookie(header, name)) is not None:
            return value
    return None
