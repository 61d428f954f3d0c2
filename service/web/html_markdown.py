"""HTML to Markdown: a child process's job, so `serve` never holds bs4 or markdownify.

The converter (BeautifulSoup, markdownify, and the lxml and charset_normalizer
that bs4 loads when installed) would cost `serve` 5 to 9 MB for as long as it
runs, yet documents are converted only when they are rendered: at start-up and
at a retirement midnight. `documents.markdown_of` runs this module as
`python -m service.web.html_markdown`: pages as JSON on stdin, and on stdout
{"markdown": [...]}, or {"broken": "why"} for a page that breaks a rule.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Final
from urllib.parse import urljoin

from bs4 import BeautifulSoup, Tag
from markdownify import MarkdownConverter

_BLANK_LINES: Final = re.compile(r"\n{3,}")


class _Converter(MarkdownConverter):
    """markdownify, with `|` escaped inside table cells so GFM tables stay intact."""

    def convert_td(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        return str(super().convert_td(el, text.replace("|", r"\|"), parent_tags))  # type: ignore[misc]

    def convert_th(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        return str(super().convert_th(el, text.replace("|", r"\|"), parent_tags))  # type: ignore[misc]


_CONVERTER: Final = _Converter(heading_style="atx", bullets="-", escape_misc=False)


def html_to_markdown(html: str, page_url: str) -> str:
    """Turn a rendered page into front matter plus the Markdown of its <main>."""
    soup = BeautifulSoup(html, "html.parser")
    main = soup.find("main")
    title = soup.find("title")
    description = soup.find("meta", attrs={"name": "description"})
    if not (isinstance(main, Tag) and isinstance(title, Tag) and soup.html):
        raise ValueError(f"{page_url}: a document needs <title> and <main>")
    for attribute, tags in (("href", ("a", "link")), ("src", ("img", "video"))):
        for node in main.find_all(tags):
            if isinstance(node, Tag) and (target := node.get(attribute)):
                node[attribute] = urljoin(page_url, str(target))
    front = {
        "title": title.get_text(strip=True),
        "description": (
            str(description.get("content", "")) if isinstance(description, Tag) else ""
        ),
        "lang": str(soup.html.get("lang", "")),
    }
    lines = ["---"]
    lines += [
        f"{key}: {json.dumps(value, ensure_ascii=False)}"
        for key, value in front.items()
    ]
    body = _BLANK_LINES.sub("\n\n", _CONVERTER.convert_soup(main)).strip()
    if not body.startswith("# ") or "\n# " in body:
        raise ValueError(f"{page_url}: <main> must hold exactly one <h1>, first")
    return "\n".join(lines) + "\n---\n\n" + body + "\n"


def main() -> None:
    """Convert [[html, url], ...] from stdin; answer on stdout."""
    pages = json.loads(sys.stdin.buffer.read())
    answer: dict[str, str | list[str]]
    try:
        answer = {"markdown": [html_to_markdown(html, url) for html, url in pages]}
    except ValueError as err:
        answer = {"broken": str(err)}
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=False).encode())


if __name__ == "__main__":
    main()
