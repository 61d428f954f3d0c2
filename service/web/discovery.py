"""Build the crawler and machine files once: robots, sitemap, llms, catalogs."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any, Final

from aiohttp import hdrs

from ..content import Content
from .documents import CONTENT_SIGNAL, MARKDOWN_TYPE
from .headers import SecurityHeaders
from .openapi import build_openapi
from .rendering import Page
from .representation import Representation, prepare as prepare_representation

TEXT_TYPE: Final = "text/plain; charset=utf-8"
CATALOG_PROFILE: Final = "https://www.rfc-editor.org/info/rfc9727"
CATALOG_TYPE: Final = f'application/linkset+json; profile="{CATALOG_PROFILE}"'


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, indent=2).encode()


def api_catalog(base_url: str) -> dict[str, Any]:
    """Return the RFC 9727 linkset: one anchor, each relation an array of targets."""
    return {
        "linkset": [
            {
                "anchor": f"{base_url}/.well-known/api-catalog",
                "item": [{"href": f"{base_url}/", "title": "Public interface"}],
            },
            {
                "anchor": f"{base_url}/",
                "service-desc": [
                    {"href": f"{base_url}/openapi.json", "type": "application/json"}
                ],
                "service-doc": [
                    {"href": f"{base_url}/api-docs", "type": "text/html"},
                    {"href": f"{base_url}/api-docs", "type": "text/markdown"},
                ],
                "service-meta": [
                    {
                        "href": f"{base_url}/auth.md",
                        "type": "text/markdown",
                        "title": "Authentication",
                    },
                    {
                        "href": f"{base_url}/llms.txt",
                        "type": "text/plain",
                        "title": "llms.txt",
                    },
                ],
                "status": [{"href": f"{base_url}/healthz", "type": "application/json"}],
            },
        ]
    }


# The machine files rendered from templates, in the order of `machine_pages`.
_TEMPLATED: Final = ("robots.txt", "sitemap.xml", "llms.txt", "auth.md")


def machine_pages(content: Content, context: Mapping[str, Any]) -> list[Page]:
    """The machine files that come from templates, to render with the documents."""
    documents = sorted(content.documents.values(), key=lambda meta: meta.path)
    listed = {**context, "documents": documents}
    return [
        Page(name, listed if name == "sitemap.xml" else context) for name in _TEMPLATED
    ]


def build_machine_files(
    content: Content,
    context: Mapping[str, Any],
    rendered: Sequence[tuple[str, str | None]],
    base_url: str,
    security: SecurityHeaders,
) -> dict[str, Representation]:
    """Prepare every non-document public file; `rendered`: `machine_pages`'s."""
    prepare = partial(prepare_representation, security=security)
    robots, sitemap, llms, auth = (text.encode() for text, _ in rendered)
    openapi = build_openapi(base_url, content.site["name_en"], context["contact_email"])
    return {
        "healthz": prepare(
            b'{"status":"ok"}',
            "application/json",
            {hdrs.CACHE_CONTROL: "no-store"},
            etag=False,
        ),
        "robots": prepare(robots, TEXT_TYPE, tag="robots"),
        "sitemap": prepare(sitemap, "application/xml; charset=utf-8", tag="sitemap"),
        "llms": prepare(llms, TEXT_TYPE, tag="llms"),
        "openapi": prepare(_json(openapi), "application/json", tag="openapi"),
        "api_catalog": prepare(
            _json(api_catalog(base_url)),
            CATALOG_TYPE,
            {hdrs.LINK: f'<{base_url}/.well-known/api-catalog>; rel="api-catalog"'},
            tag="catalog",
        ),
        "auth_md": prepare(
            auth,
            MARKDOWN_TYPE,
            {"Content-Signal": CONTENT_SIGNAL},
            tag="auth",
        ),
    }
