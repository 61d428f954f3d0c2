"""Render each document once at start-up: HTML, and Markdown from that HTML."""

from __future__ import annotations

import hashlib
import json
import math
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import jinja2
from aiohttp import hdrs, web

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
# The directory `service` sits in: where the converter child finds this package.
_PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]
_CHILD_SECONDS: Final = 120.0
# Digest of (html, url) -> Markdown, oldest first; two editions of every document fit.
_CONVERTED: dict[bytes, str] = {}
_CACHE_SIZE: Final = 64


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


def markdown_of(pages: Sequence[tuple[str, str]]) -> list[str]:
    """Return the Markdown of each (html, url), converted in one child process.

    A page rendered again unchanged (another edition, another app in the
    process) is converted once. A page that breaks a document's rules raises
    ValueError with the child's one line.
    """
    digests = [_digest(page) for page in pages]
    known = {d: _CONVERTED[d] for d in digests if d in _CONVERTED}
    missing = {d: p for d, p in zip(digests, pages, strict=True) if d not in known}
    if missing:
        child = subprocess.run(
            [sys.executable, "-m", "service.web.html_markdown"],
            input=json.dumps(list(missing.values())).encode(),
            capture_output=True,
            cwd=_PACKAGE_ROOT,
            timeout=_CHILD_SECONDS,
            check=False,
        )
        if child.returncode != 0:
            raise RuntimeError(
                f"the Markdown converter exited {child.returncode}: "
                + child.stderr.decode(errors="replace")[-2000:]
            )
        answer = json.loads(child.stdout)
        if "broken" in answer:
            raise ValueError(answer["broken"])
        known |= zip(missing, answer["markdown"], strict=True)
        _CONVERTED.update(known)
        while len(_CONVERTED) > _CACHE_SIZE:
            del _CONVERTED[next(iter(_CONVERTED))]
    return [known[d] for d in digests]


def _digest(page: tuple[str, str]) -> bytes:
    """Key a page by its bytes' digest: the cache need not hold the HTML itself."""
    html, url = page
    return hashlib.sha256(f"{url}\n{html}".encode()).digest()


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


def render_documents(
    env: jinja2.Environment,
    content: Content,
    context: Mapping[str, Any],
    base_url: str,
    security: SecurityHeaders,
) -> dict[str, Document]:
    """Render every document of content/site.toml through its template."""
    rendered = []
    for name, meta in content.documents.items():
        template = env.get_template(
            "home.html" if name.startswith("home") else f"{name}.html"
        )
        html = template.render(**context, doc=meta, zh=meta.lang.startswith("zh"))
        rendered.append((name, meta, html))
    markdowns = markdown_of([(html, base_url + m.path) for _, m, html in rendered])
    return {
        name: build_document(meta, html, markdown, base_url, security)
        for (name, meta, html), markdown in zip(rendered, markdowns, strict=True)
    }


def document_handler(
    document: Document,
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """Serve a document in the representation its request negotiates."""
    html, markdown = document.html, document.markdown

    async def handler(request: web.Request) -> web.StreamResponse:
        wants_markdown = prefers_markdown(request.headers.get(hdrs.ACCEPT))
        return respond(request, markdown if wants_markdown else html)

    return handler
