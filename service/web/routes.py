"""The public URL table: the router and /openapi.json are both built from it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler


class Kind(StrEnum):
    """What an endpoint serves, which fixes its media types in /openapi.json."""

    HEALTH = "health"
    DOCUMENT = "document"
    ROBOTS = "robots"
    SITEMAP = "sitemap"
    LLMS = "llms"
    OPENAPI = "openapi"
    CATALOG = "catalog"
    AUTH = "auth"


@dataclass(frozen=True, slots=True)
class PublicRoute:
    """One anonymous GET endpoint of the specification's section 4."""

    path: str
    name: str
    kind: Kind
    summary: str


PUBLIC_ROUTES: Final = (
    PublicRoute("/healthz", "healthz", Kind.HEALTH, "Process liveness"),
    PublicRoute("/", "home", Kind.DOCUMENT, "Home (Chinese)"),
    PublicRoute("/en", "home_en", Kind.DOCUMENT, "Home (English)"),
    PublicRoute("/terms", "terms", Kind.DOCUMENT, "Terms of service"),
    PublicRoute("/privacy", "privacy", Kind.DOCUMENT, "Privacy policy"),
    PublicRoute("/refund", "refund", Kind.DOCUMENT, "Refund policy"),
    PublicRoute("/api-docs", "api_docs", Kind.DOCUMENT, "API description"),
    PublicRoute(
        "/robots.txt", "robots", Kind.ROBOTS, "Crawl rules and content signals"
    ),
    PublicRoute(
        "/sitemap.xml", "sitemap", Kind.SITEMAP, "Indexable pages with hreflang"
    ),
    PublicRoute("/llms.txt", "llms", Kind.LLMS, "Site summary for language models"),
    PublicRoute("/openapi.json", "openapi", Kind.OPENAPI, "OpenAPI 3.1 description"),
    PublicRoute(
        "/.well-known/api-catalog",
        "api_catalog",
        Kind.CATALOG,
        "API catalog (RFC 9727)",
    ),
    PublicRoute("/auth.md", "auth_md", Kind.AUTH, "Authentication description"),
)


def setup_public_routes(app: web.Application, handlers: Mapping[str, Handler]) -> None:
    """Register GET and HEAD for every public route, by name."""
    missing = {route.name for route in PUBLIC_ROUTES} - set(handlers)
    if missing:
        raise ValueError(f"no handler for public routes {sorted(missing)}")
    app.router.add_routes(
        [
            web.get(route.path, handlers[route.name], name=route.name)
            for route in PUBLIC_ROUTES
        ]
    )
