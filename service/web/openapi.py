"""Describe the public routes as OpenAPI 3.1, from the same table the router uses."""

from __future__ import annotations

from typing import Any, Final

from .. import __version__
from .routes import PUBLIC_ROUTES, Kind, PublicRoute

_TEXT: Final = {"type": "string"}
_VARY: Final = {
    "required": True,
    "description": "Always names Accept: the representation is negotiated.",
    "schema": {"type": "string", "pattern": "[Aa][Cc][Cc][Ee][Pp][Tt]"},
}
_LINK: Final = {
    "required": True,
    "description": 'RFC 8288 links, rel="alternate" to the Markdown among them.',
    "schema": {"type": "string", "pattern": 'rel="alternate"'},
}
_ETAG: Final = {
    "required": True,
    "description": "Strong validator, distinct per representation and content coding.",
    "schema": {"type": "string"},
}
_SIGNAL: Final = {
    "required": True,
    "description": "Content usage: search=yes, ai-input=yes, ai-train=no.",
    "schema": {"type": "string"},
}
_NOT_MODIFIED: Final = {"description": "The representation matches If-None-Match."}


def media_for(kind: Kind) -> dict[str, Any]:
    """Name the media types (and schemas) an endpoint kind answers with."""
    if kind is Kind.HEALTH:
        return {
            "application/json": {
                "schema": {
                    "type": "object",
                    "required": ["status"],
                    "properties": {"status": {"type": "string", "enum": ["ok"]}},
                    "additionalProperties": False,
                }
            }
        }
    types = {
        Kind.DOCUMENT: ("text/html", "text/markdown"),
        Kind.ROBOTS: ("text/plain",),
        Kind.LLMS: ("text/plain",),
        Kind.SITEMAP: ("application/xml",),
        Kind.AUTH: ("text/markdown",),
    }
    if kind in types:
        return {media: {"schema": _TEXT} for media in types[kind]}
    if kind is Kind.OPENAPI:
        return {
            "application/json": {"schema": {"type": "object", "required": ["openapi"]}}
        }
    return {
        "application/linkset+json": {
            "schema": {
                "type": "object",
                "required": ["linkset"],
                "properties": {"linkset": {"type": "array", "minItems": 1}},
            }
        }
    }


def _operation(route: PublicRoute) -> dict[str, Any]:
    ok: dict[str, Any] = {
        "description": route.summary,
        "content": media_for(route.kind),
    }
    responses: dict[str, Any] = {"200": ok}
    if route.kind is Kind.DOCUMENT:
        ok["description"] += (
            ". HTML unless Accept names text/markdown explicitly and prefers it;"
            " both representations carry the same content."
        )
        ok["headers"] = {
            "Vary": _VARY,
            "Link": _LINK,
            "ETag": _ETAG,
            "Content-Signal": _SIGNAL,
        }
    elif route.kind is Kind.CATALOG:
        ok["headers"] = {
            "Link": {
                "required": True,
                "description": 'rel="api-catalog" link to this document, also on HEAD.',
                "schema": {"type": "string", "pattern": 'rel="api-catalog"'},
            }
        }
    elif route.kind is Kind.HEALTH:
        ok["headers"] = {
            "Cache-Control": {
                "required": True,
                "schema": {"type": "string", "enum": ["no-store"]},
            }
        }
    if route.kind is not Kind.HEALTH:
        ok.setdefault("headers", {})["ETag"] = _ETAG
        responses["304"] = _NOT_MODIFIED
    return {
        "operationId": "get" + "".join(part.title() for part in route.name.split("_")),
        "summary": route.summary,
        "security": [],
        "responses": responses,
    }


def build_openapi(base_url: str, site_name: str, contact_email: str) -> dict[str, Any]:
    """Return the OpenAPI 3.1 document of the public, anonymous endpoints."""
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"{site_name} public interface",
            "version": __version__,
            "summary": "Anonymous read-only documents, crawler files and indexes.",
            "description": (
                "Only these GET endpoints form the public contract. They need no"
                " authentication and have no rate limit. The internal /api/* interface"
                " serves the workbench's own front end and is not for outside clients."
            ),
            "contact": {"email": contact_email},
        },
        "servers": [{"url": base_url}],
        "security": [],
        "paths": {route.path: {"get": _operation(route)} for route in PUBLIC_ROUTES},
    }
