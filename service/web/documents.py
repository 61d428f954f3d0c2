"""Render each document once at start-up: HTML, and Markdown from that HTML."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urljoin

import jinja2
from aiohttp import hdrs, web
from bs4 import BeautifulSoup, Tag
from markdownify import MarkdownConverter

from ..content import Content, DocumentMeta
from .headers import SecurityHeaders
from .negotiation import prefers_markdown
from .representation import Representation, prepare, respond

CONTENT_SIGNAL: Final = "search=yes, ai-input=yes, ai-train=no"
HTML_TYPE: Final = "text/html; charset=utf-8"
MARKDOWN_TYPE: Final = "text/markdown; charset=utf-8"

# Han, kana, hangul, CJK punctuation and full-width forms: about one token each.
_CJK: Final = re.compile(
    r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)
_BLANK_LINES: Final = re.compile(r"\n{3,}")


@dataclass(frozen=True, slots=True)
class Document:
    """One document in its two representations."""

    meta: DocumentMeta
    html: Representation
    markdown: Representation


class _Converter(MarkdownConverter):
    """markdownify, with `|` escaped inside table cells so GFM tables stay intact."""

    def convert_td(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        return str(super().convert_td(el, text.replace("|", r"\|"), parent_tags))  # type: ignore[misc]

    def convert_th(self, el: Tag, text: str, parent_tags: set[str]) -> str:
        return str(super().convert_th(el, text.replace("|", r"\|"), parent_tags))  # type: ignore[misc]


_CONVERTER: Final = _Converter(heading_style="atx", bullets="-", escape_misc=False)


def estimate_tokens(text: str) -> int:
    """Estimate tokens: one per CJK character, one per four other characters."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


# A page rendered again unchanged (another app in the process) is parsed once.
@functools.lru_cache(maxsize=64)
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


def _links(url: str, markdown: bool, home: bool, base_url: str) -> str:
    links = [f'<{url}>; rel="alternate"; type="text/markdown"']
    if markdown:
        links.append(f'<{url}>; rel="alternate"; type="text/html"')
    if home:
        links += [
            f'<{base_url}/.well-known/api-catalog>; rel="api-catalog"',
            f'<{base_url}/openapi.json>; rel="service-desc"; type="application/json"',
            f'<{base_url}/api-docs>; rel="service-doc"; type="text/html"',
        ]
    return ", ".join(links)


def build_document(
    meta: DocumentMeta, html: str, base_url: str, security: SecurityHeaders
) -> Document:
    """Prepare both representations of a rendered page, with their headers."""
    url = base_url + meta.path
    home = meta.name.startswith("home")
    markdown = html_to_markdown(html, url)
    common = {
        hdrs.VARY: "Accept",
        hdrs.CACHE_CONTROL: "no-cache",
        "Content-Signal": CONTENT_SIGNAL,
    }
    return Document(
        meta=meta,
        html=prepare(
            html.encode(),
            HTML_TYPE,
            {**common, hdrs.LINK: _links(url, False, home, base_url)},
            security=security,
            tag="html",
        ),
        markdown=prepare(
            markdown.encode(),
            MARKDOWN_TYPE,
            {
                **common,
                hdrs.LINK: _links(url, True, home, base_url),
                "x-markdown-tokens": str(estimate_tokens(markdown)),
            },
            security=security,
            tag="md",
        ),
    )


def render_documents(
    env: jinja2.Environment,
    content: Content,
    context: Mapping[str, Any],
    base_url: str,
    security: SecurityHeaders,
) -> dict[str, Document]:
    """Render every document of content/site.toml through its template."""
    documents = {}
    for name, meta in content.documents.items():
        template = env.get_template(
            "home.html" if name.startswith("home") else f"{name}.html"
        )
        html = template.render(**context, doc=meta, zh=meta.lang.startswith("zh"))
        documents[name] = build_document(meta, html, base_url, security)
    return documents


def document_handler(
    document: Document,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Serve a document in the representation its request negotiates."""
    html, markdown = document.html, document.markdown

    async def handler(request: web.Request) -> web.StreamResponse:
        wants_markdown = prefers_markdown(request.headers.get(hdrs.ACCEPT))
        return respond(request, markdown if wants_markdown else html)

    return handler
