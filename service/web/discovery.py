"""Build the crawler and machine files once: robots, sitemap, llms, catalogs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import partial
from typing import Any, Final

import jinja2
from aiohttp import hdrs

from ..content import Content
from .documents import CONTENT_SIGNAL, MARKDOWN_TYPE
from .headers import SecurityHeaders
from .openapi import build_openapi
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


def render_machine_files(
    env: jinja2.Environment,
    content: Content,
    context: Mapping[str, Any],
    base_url: str,
    security: SecurityHeaders,
) -> dict[str, Representation]:
    """Render every non-document public file into its prepared representation."""
    prepare = partial(prepare_representation, security=security)

    def render(name: str) -> bytes:
        return env.get_template(name).render(**context).encode()

    documents = sorted(content.documents.values(), key=lambda meta: meta.path)
    sitemap = env.get_template("sitemap.xml").render(**context, documents=documents)
    openapi = build_openapi(base_url, content.site["name_en"], context["contact_email"])
    return {
        "healthz": prepare(
            b'{"status":"ok"}',
            "application/json",
            {hdrs.CACHE_CONTROL: "no-store"},
            etag=False,
        ),
        "robots": prepare(render("robots.txt"), TEXT_TYPE, tag="robots"),
        "sitemap": prepare(
            sitemap.encode(), "application/xml; charset=utf-8", tag="sitemap"
        ),
        "llms": prepare(render("llms.txt"), TEXT_TYPE, tag="llms"),
        "openapi": prepare(_json(openapi), "application/json", tag="openapi"),
        "api_catalog": prepare(
            _json(api_catalog(base_url)),
            CATALOG_TYPE,
            {hdrs.LINK: f'<{base_url}/.well-known/api-catalog>; rel="api-catalog"'},
            tag="catalog",
        ),
        "auth_md": prepare(
            render("auth.md"),
            MARKDOWN_TYPE,
            {"Content-Signal": CONTENT_SIGNAL},
            tag="auth",
        ),
    }
