"""The Accept table of CONTRACT §2, and properties of the chooser."""

from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from service.web.negotiation import accepts_gzip, prefers_markdown

CHROME = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,*/*;q=0.8"

TABLE = [
    (None, False),
    ("", False),
    ("*/*", False),
    ("text/*", False),
    (CHROME, False),
    ("application/json", False),
    ("garbage", False),
    (";;;,,,", False),
    ("text/markdown", True),
    ("TEXT/Markdown", True),
    ("text/markdown ; Q=1", True),
    ("text/markdown;charset=utf-8", True),
    ("text/markdown, text/html, */*", True),
    ("text/markdown, text/html;q=0.9, */*;q=0.1", True),
    ("text/markdown;q=0.9, text/html", False),
    ("text/html, text/markdown", False),
    ("text/html, text/markdown;q=0.5", False),
    ("text/html;q=1.0, text/markdown;q=0.5", False),
    ("text/markdown;q=0", False),
    ("text/markdown;q=0.000", False),
    ("text/markdown;q=1.", True),  # RFC 9110 §12.4.2: "1." and "0." are qvalues
    ("text/markdown;q=0.", False),
    ("text/markdown;q=0.5, text/html;q=1.", False),
    ("text/html;q=0., text/markdown", True),
    ("text/html;q=0, text/markdown", True),
    ("text/html,text/markdown;q=0", False),
    ("*/*, text/markdown", True),
    ("text/*, text/markdown", True),
    ("text/*;q=0.5, text/markdown;q=0.5", True),
    ("*/*;q=0.8, text/markdown;q=0.5", False),
    ("text/markdown;q=abc", False),
    ("text/markdown;q=1.5", False),
    ("text/markdown;q=0.²", False),  # a digit to str.isdigit(), not to float()
    ("text/markdown;q=0.5, text/html;q=abc", True),
    ("text/markdown;q=0.5, */*;q=0.4", True),
    ("application/json, text/markdown;q=0.1", True),
]


@pytest.mark.parametrize(("accept", "markdown"), TABLE)
def test_accept_table_picks_the_contracted_representation(
    accept: str | None, markdown: bool
) -> None:
    """Every row of the negotiation table gives its representation."""
    assert prefers_markdown(accept) is markdown


_media = st.sampled_from(
    ["text/html", "text/markdown", "text/*", "*/*", "application/json", "TEXT/MARKDOWN"]
)
_q = st.one_of(
    st.none(),
    st.sampled_from(["0", "0.5", "1", "1.0", "0.001", "abc", "2", ""]),
    st.text(max_size=4),
)


@st.composite
def _accept(draw: st.DrawFn) -> str:
    parts = []
    for media in draw(st.lists(_media, max_size=5)):
        q = draw(_q)
        parts.append(media if q is None else f"{media};q={q}")
    return ", ".join(parts)


@given(st.one_of(_accept(), st.text(max_size=80)))
def test_chooser_never_raises_and_needs_markdown_named(accept: str) -> None:
    """Any header gives an answer; Markdown only when text/markdown is named."""
    result = prefers_markdown(accept)
    if "text/markdown" not in accept.lower():
        assert result is False


@given(_accept())
def test_markdown_at_q_zero_is_never_chosen(accept: str) -> None:
    """text/markdown;q=0 everywhere it appears means HTML."""
    zeroed = accept.lower().replace("text/markdown;q=", "text/markdown;q=0;x=")
    zeroed = ", ".join(
        "text/markdown;q=0" if part.strip().startswith("text/markdown") else part
        for part in zeroed.split(",")
    )
    assert prefers_markdown(zeroed) is False


@pytest.mark.parametrize(
    ("accept_encoding", "gzip"),
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("gzip, deflate, br", True),
        ("br;q=1, gzip;q=0.5", True),
        ("gzip;q=0", False),
        ("*", True),
        ("*;q=0", False),
        ("identity", False),
        ("gzip;q=0, *", False),
        ("gzip;q=0.²", False),
    ],
)
def test_gzip_is_used_only_when_accepted(
    accept_encoding: str | None, gzip: bool
) -> None:
    """Accept-Encoding q-values decide the gzip variant."""
    assert accepts_gzip(accept_encoding) is gzip
