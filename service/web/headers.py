"""Security headers: baked into prepared responses, added to dynamic ones."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from functools import cached_property

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from ..api.boundary import ApiBoundary


def content_security_policy(inline_style: str, media_origin: str = "") -> str:
    """Allow exactly our one inline stylesheet, our media, and nothing scripted."""
    digest = base64.b64encode(hashlib.sha256(inline_style.encode()).digest()).decode()
    media = f"'self' {media_origin}".strip()
    return (
        "default-src 'none'; "
        f"style-src 'sha256-{digest}'; "
        f"img-src {media} data:; media-src {media}; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    )


@dataclass(frozen=True)
class SecurityHeaders:
    """The headers every response carries, decided once from the settings."""

    https: bool
    csp: str

    @cached_property
    def common(self) -> dict[str, str]:
        """Return nosniff, the referrer policy and, under https, HSTS."""
        headers = {
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "strict-origin-when-cross-origin",
        }
        if self.https:
            headers["Strict-Transport-Security"] = "max-age=63072000; includeSubDomains"
        return headers

    def for_type(self, content_type: str) -> dict[str, str]:
        """Return the headers for a body of this type (HTML also gets the CSP)."""
        if content_type.startswith("text/html"):
            return {**self.common, "Content-Security-Policy": self.csp}
        return self.common


def setup_headers(api: ApiBoundary, security: SecurityHeaders) -> None:
    """Add the security headers to every API answer, errors included."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        async def secured(request: web.Request) -> web.StreamResponse:
            """Pick the headers by the type of the body actually sent."""
            response = await handler(request)
            content_type = response.headers.get(hdrs.CONTENT_TYPE, "")
            response.headers.update(security.for_type(content_type))
            return response

        return secured

    api.add_layer(layer)
