"""HTML to Markdown in a child process: the conversion, its refusals, its cache."""

from __future__ import annotations

import sys
import uuid

import pytest

from service.web.documents import markdown_of


def _page(main: str, title: str = "A page") -> str:
    return (
        f'<html lang="en"><head><title>{title}</title>'
        '<meta name="description" content="What it says"></head>'
        f"<body><nav><a href='/'>home</a></nav><main>{main}</main></body></html>"
    )


def test_a_page_becomes_front_matter_and_the_markdown_of_its_main() -> None:
    """Links turn absolute, `|` in a table cell is escaped, the nav is left out."""
    html = _page(
        f"<h1>Prices {uuid.uuid4().hex}</h1><p>See <a href='terms'>the terms</a>.</p>"
        "<table><tr><th>Plan</th><th>Note</th></tr>"
        "<tr><td>Basic</td><td>a | b</td></tr></table>"
    )
    [markdown] = markdown_of([(html, "https://example.cn/en/prices")])
    front, body = markdown.split("\n---\n\n")
    assert front.splitlines() == [
        "---",
        'title: "A page"',
        'description: "What it says"',
        'lang: "en"',
    ]
    assert body.startswith("# Prices ")
    assert "[the terms](https://example.cn/en/terms)" in body
    assert r"| Basic | a \| b |" in body
    assert "home" not in body


@pytest.mark.parametrize(
    ("html", "reason"),
    [
        ("<html><head><title>t</title></head><body>no main</body></html>",
         "https://example.cn/x: a document needs <title> and <main>"),
        (_page("<p>no heading</p>"),
         "https://example.cn/x: <main> must hold exactly one <h1>, first"),
        (_page("<h1>one</h1><h1>two</h1>"),
         "https://example.cn/x: <main> must hold exactly one <h1>, first"),
    ],
)  # fmt: skip
def test_a_page_that_breaks_a_documents_rule_is_refused_with_the_reason(
    html: str, reason: str
) -> None:
    """The child's one-line reason comes back as the parent's ValueError."""
    with pytest.raises(ValueError, match="^" + reason.replace("?", r"\?") + "$"):
        markdown_of(
            [
                (_page(f"<h1>{uuid.uuid4().hex}</h1>"), "u"),
                (html, "https://example.cn/x"),
            ]
        )


def test_a_page_converted_once_is_not_converted_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With no interpreter to start, a known page is answered; a new one is not."""
    page = (_page(f"<h1>{uuid.uuid4().hex}</h1>"), "https://example.cn/a")
    [first] = markdown_of([page])
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert markdown_of([page, page]) == [first, first]
    with pytest.raises(FileNotFoundError):
        markdown_of([page, (_page(f"<h1>{uuid.uuid4().hex}</h1>"), "u")])


def test_a_converter_that_fails_is_an_error_that_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child that exits non-zero (here `false`) raises RuntimeError, not a page."""
    monkeypatch.setattr(sys, "executable", "/bin/false")
    with pytest.raises(RuntimeError, match="the Markdown converter exited 1"):
        markdown_of([(_page(f"<h1>{uuid.uuid4().hex}</h1>"), "u")])


def test_a_known_page_is_answered_even_when_its_batch_pushes_it_out() -> None:
    """A batch larger than the cache still answers its pages converted before."""
    known = (_page(f"<h1>{uuid.uuid4().hex}</h1>"), "https://example.cn/k")
    [first] = markdown_of([known])
    batch = [(_page(f"<h1>{uuid.uuid4().hex}</h1>"), f"u{n}") for n in range(70)]
    answered = markdown_of([known, *batch])
    assert answered[0] == first
    assert [m.split("\n# ", 1)[1][:32] for m in answered[1:]] == [
        html.split("<h1>", 1)[1][:32] for html, _ in batch
    ]
