"""Choose a document's representation from Accept, exactly and cheaply."""

from __future__ import annotations

from functools import lru_cache
from typing import Final, NamedTuple

_HTML_RANKS: Final = {"text/html": 3, "text/*": 2, "*/*": 1}


class _Range(NamedTuple):
    media: str
    q: float
    position: int


def _parse_q(value: str) -> float | None:
    """Read a qvalue as RFC 9110 §12.4.2 writes it; anything else is malformed."""
    value = value.strip()
    if not value or len(value) > 5 or value[0] not in "01" or not value.isascii():
        return None
    # "1." and "0." are qvalues too: the grammar allows no digit after the dot
    if len(value) > 1 and (
        value[1] != "." or not (value[2:].isdigit() or len(value) == 2)
    ):
        return None
    q = float(value)
    return q if q <= 1 else None


def _ranges(accept: str) -> list[_Range]:
    ranges: list[_Range] = []
    for position, item in enumerate(accept.split(",")):
        media, *params = item.split(";")
        media = media.strip().lower()
        if media.count("/") != 1:
            continue
        q: float | None = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                q = _parse_q(value)
                break  # parameters after q are accept-extensions, not media params
        if q is not None:
            ranges.append(_Range(media, q, position))
    return ranges


@lru_cache(maxsize=512)
def prefers_markdown(accept: str | None) -> bool:
    """Tell whether Accept asks for Markdown over HTML.

    Markdown wins only when `text/markdown` is named explicitly with q > 0 and
    its q beats the q of the most specific range matching `text/html`
    (`text/html` > `text/*` > `*/*`), or ties with it while the Markdown range
    is listed first or HTML matches only through a wildcard. Everything else,
    malformed input included, gets HTML: we never answer 406.
    """
    if not accept or "markdown" not in accept.lower():
        return False
    markdown: _Range | None = None
    html: _Range | None = None
    html_rank = 0
    for entry in _ranges(accept):
        if entry.media == "text/markdown":
            if markdown is None or entry.q > markdown.q:
                markdown = entry
        elif (rank := _HTML_RANKS.get(entry.media, 0)) > html_rank:
            html, html_rank = entry, rank
    if markdown is None or markdown.q <= 0:
        return False
    if html is None or markdown.q > html.q:
        return True
    if markdown.q < html.q:
        return False
    return html_rank < 3 or markdown.position < html.position


@lru_cache(maxsize=128)
def accepts_gzip(accept_encoding: str | None) -> bool:
    """Tell whether Accept-Encoding admits gzip (explicitly or through `*`)."""
    if not accept_encoding:
        return False
    verdict: dict[str, float] = {}
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        q: float | None = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                q = _parse_q(value)
        if q is not None:
            verdict[coding.strip().lower()] = q
    q = verdict.get("gzip", verdict.get("x-gzip", verdict.get("*", 0.0)))
    return q > 0
