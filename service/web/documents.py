"""Each document in two representations: HTML, and Markdown from that HTML."""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import hdrs, web

from ..content import Content, DocumentMeta
from .headers import SecurityHeaders
from .negotiation import prefers_markdown
from .rendering import Page
from .representation import Representation, prepare, respond

CONTENT_SIGNAL: Final = "search=yes, ai-input=yes, ai-train=no"
HTML_TYPE: Final = "text/html; charset=utf-8"
MARKDOWN_TYPE: Final = "text/markdown; charset=utf-8"

# Han, kana, hangul, CJK punctuation and full-width forms: about one token each.
_CJK: Final = re.compile(
    r"[\u3000-\u303f\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]"
)


@dataclass(frozen=True, slots=True)
class Document:
    """One document in its two representations."""

    meta: DocumentMeta
    html: Representation
    markdown: Representation


def estimate_tokens(text: str) -> int:
    """Estimate tokens: one per CJK character, one per four other characters."""
    cjk = len(_CJK.findall(text))
    return cjk + math.ceil((len(text) - cjk) / 4)


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
    meta: DocumentMeta,
    html: str,
    markdown: str,
    base_url: str,
    security: SecurityHeaders,
) -> Document:
    """Prepare both representations of a rendered page, with their headers."""
    url = base_url + meta.path
    home = meta.name.startswith("home")
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


def document_pages(
    content: Content, context: Mapping[str, Any], base_url: str
) -> list[Page]:
    """Each document of content/site.toml: its template, and its URL to convert."""
    return [
        Page(
            "home.html" if name.startswith("home") else f"{name}.html",
            {**context, "doc": meta, "zh": meta.lang.startswith("zh")},
            markdown_url=base_url + meta.path,
        )
        for name, meta in content.documents.items()
    ]


def build_documents(
    content: Content,
    rendered: Sequence[tuple[str, str | None]],
    base_url: str,
    security: SecurityHeaders,
) -> dict[str, Document]:
    """Prepare the documents from what `document_pages` rendered, in its order."""
    documents = {}
    for (name, meta), (html, markdown) in zip(
        content.documents.items(), rendered, strict=True
    ):
        assert markdown is not None  # asked of every document page
        documents[name] = build_document(meta, html, markdown, base_url, security)
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
