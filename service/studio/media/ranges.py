"""Read the one byte range a browser asks for (seeking a video), for the bucket."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from obstore import OffsetRange, SuffixRange

# One range of bytes; 18 digits keep every number inside the client's 64 bits.
_RANGE: Final = re.compile(r"bytes=(\d{0,18})-(\d{0,18})")


def requested_range(
    header: str | None,
) -> OffsetRange | SuffixRange | tuple[int, int] | None:
    """Turn a Range header into obstore's range, or None for the whole object.

    RFC 9110 lets a server ignore a Range it does not take: several ranges,
    another unit or a malformed one all get the whole object (200), as
    aiohttp's own FileResponse does for the directory store.
    """
    if header is None:
        return None
    match = _RANGE.fullmatch(header.strip())
    if match is None:
        return None
    first, last = match.groups()
    if not first:
        if not last or int(last) == 0:
            return None
        return {"suffix": int(last)}
    start = int(first)
    if not last:
        return {"offset": start}
    if int(last) < start:
        return None
    return (start, int(last) + 1)  # obstore's end is exclusive


def entity_tag_matches(header: str, etag: str) -> bool:
    """Compare If-None-Match's list with our ETag, weakly (RFC 9110 §13.1.2)."""
    if header.strip() == "*":
        return True
    ours = etag.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == ours for tag in header.split(","))
