"""HTML to Markdown: front matter, absolute links, escaped cells, and its refusals."""

from __future__ import annotations

import pytest

from service.web.html_markdown import html_to_markdown


def page(main: str, title: str = "A page") -> str:
    """A whole HTML page around `main`, with a nav the Markdown leaves out."""
    return (
        f'<html lang="en"><head><title>{title}</title>'
        '<meta name="description" content="What it says"></head>'
        f"<body><nav><a href='/'>home</a></nav><main>{main}</main></body></html>"
    )


def test_a_page_becomes_front_matter_and_the_markdown_of_its_main() -> None:
    """Links turn absolute, `|` in a table cell is escaped, the nav is left out."""
    html = page(
        "<h1>Prices</h1><p>See <a href='terms'>the terms</a>.</p>"
        "<table><tr><th>Plan</th><th>Note</th></tr>"
        "<tr><td>Basic</td><td>a | b</td></tr></table>"
    )
    markdown = html_to_markdown(html, "https://example.cn/en/prices")
    front, body = markdown.split("\n---\n\n")
    assert front.splitlines() == [
        "---",
        'title: "A page"',
        'description: "What it says"',
        'lang: "en"',
    ]
    assert body.startswith("# Prices\n")
    assert "[the terms](https://example.cn/en/terms)" in body
    assert r"| Basic | a \| b |" in body
    assert "home" not in body


@pytest.mark.parametrize(
    ("html", "reason"),
    [
        ("<html><head><title>t</title></head><body>no main</body></html>",
         "https://example.cn/x: a document needs <title> and <main>"),
        (page("<p>no heading</p>"),
         "https://example.cn/x: <main> must hold exactly one <h1>, first"),
        (page("<h1>one</h1><h1>two</h1>"),
         "https://example.cn/x: <main> must hold exactly one <h1>, first"),
    ],
)  # fmt: skip
def test_a_page_that_breaks_a_documents_rule_is_refused_with_the_reason(
    html: str, reason: str
) -> None:
    """One line that names the page and the rule."""
    with pytest.raises(ValueError, match="^" + reason + "$"):
        html_to_markdown(html, "https://example.cn/x")
