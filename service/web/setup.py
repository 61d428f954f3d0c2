"""The public surface: templates, security headers, and every page rendered once."""

from __future__ import annotations

import functools
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from ..api.boundary import API
from ..clock import Clock
from ..content import Content, Model
from ..keys import CLOCK, CONTENT, SETTINGS
from ..settings import Settings, resource_dir
from .discovery import render_machine_files
from .documents import HTML_TYPE, document_handler, render_documents
from .headers import SecurityHeaders, content_security_policy, setup_headers
from .keys import ERROR_PAGES, PUBLISHED, SECURITY, TEMPLATE_CONTEXT
from .openapi import media_for
from .published import Published
from .representation import Representation, prepare, respond
from .routes import PUBLIC_ROUTES, setup_public_routes
from .workbench import setup_workbench_routes

TEMPLATES_DIR: Final = resource_dir("templates")


def _static_handler(rep: Representation) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return respond(request, rep)

    return handler


def _template_context(settings: Settings, content: Content, css: str) -> dict[str, Any]:
    return {
        "site": content.site,
        "base": settings.base_url,
        "css": css,
        "contact_email": settings.contact_email or content.site["contact_email"],
        "trial_credits": settings.trial_credits,
        "models": content.models,
        "packs": content.packs,
        "content_signal": "search=yes, ai-input=yes, ai-train=no",
        "public_routes": PUBLIC_ROUTES,
        "media_types": {r.kind: ", ".join(media_for(r.kind)) for r in PUBLIC_ROUTES},
    }


def _error_pages(
    env: jinja2.Environment, context: dict[str, Any], security: SecurityHeaders
) -> dict[int, Representation]:
    template = env.get_template("error.html")
    doc = {"lang": "zh-Hans", "path": "/"}
    pages = {}
    for status in (404, 405):
        html = template.render(
            **context, doc=doc, status=status, reason=HTTPStatus(status).phrase
        )
        pages[status] = prepare(
            html.encode(),
            HTML_TYPE,
            {"Cache-Control": "no-store"},
            security=security,
            etag=False,
            compress=False,
        )
    return pages


def _origin(url: str) -> str:
    """Return scheme://host[:port] of a URL, or "" for none."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def _publish(
    env: jinja2.Environment,
    content: Content,
    context: dict[str, Any],
    settings: Settings,
    security: SecurityHeaders,
    clock: Clock,
) -> Published:
    """Render every public document and file now, and again when a model retires."""
    base_url = settings.base_url

    def render(offered: tuple[Model, ...]) -> dict[str, Handler]:
        """Render every public document and file for the models on offer."""
        today = {**context, "models": offered}
        documents = render_documents(env, content, today, base_url, security)
        files = render_machine_files(env, content, today, base_url, security)
        handlers = {name: document_handler(doc) for name, doc in documents.items()}
        return handlers | {name: _static_handler(rep) for name, rep in files.items()}

    return Published(content, render, clock)


@functools.cache
def _environment() -> jinja2.Environment:
    """One template environment per process: every app shares its compiled templates."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(("html", "xml")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )


def setup(app: web.Application) -> None:
    """Render everything public once; put security headers on every /api answer.

    The public surface serves prepared bytes: no aiohttp middleware and no
    per-request signal anywhere. Everything dynamic sits behind the /api boundary.
    """
    settings, content = app[SETTINGS], app[CONTENT]
    env = app[aiohttp_jinja2.APP_KEY] = _environment()
    css = (TEMPLATES_DIR / "site.css").read_text()
    media_origin = _origin(settings.workbench.media_public_url)
    security = app[SECURITY] = SecurityHeaders(
        https=settings.https, csp=content_security_policy(css, media_origin)
    )
    context = app[TEMPLATE_CONTEXT] = _template_context(settings, content, css)
    # Rendered again, without a restart, at the midnight a model retires.
    published = app[PUBLISHED] = _publish(
        env, content, context, settings, security, app[CLOCK]
    )
    setup_public_routes(app, published.handlers())
    setup_workbench_routes(app, env, context, security)
    app[ERROR_PAGES] = _error_pages(env, context, security)
    with app[API].placed("security_headers"):
        setup_headers(app[API], security)
    app.cleanup_ctx.append(published.ctx)
