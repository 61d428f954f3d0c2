"""Build the application: one factory for `serve`, `dev` and the tests."""

from __future__ import annotations

import gc
from http import HTTPStatus
from typing import Any, Final

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from .auth import setup_auth_routes
from .content import Content, load_content
from .csrf import setup_csrf
from .discovery import render_machine_files
from .documents import HTML_TYPE, document_handler, render_documents
from .errors import fallback_handler, setup_errors
from .headers import SecurityHeaders, content_security_policy, setup_headers
from .keys import CONTENT, SETTINGS
from .mailer import mailer_ctx
from .openapi import media_for
from .ratelimit_http import RouteLimit, setup_ratelimit, setup_remembered_denials
from .redis_store import limiter_ctx, redis_ctx
from .representation import Representation, prepare, respond
from .routes import PUBLIC_ROUTES, setup_public_routes
from .sessions import setup_sessions
from .settings import ROOT, Settings, SettingsError, variable
from .square import setup_square_routes

TEMPLATES_DIR: Final = ROOT / "templates"
# Internal JSON bodies are small; anything bigger is refused with 413 before parsing.
MAX_BODY_BYTES: Final = 16 * 1024


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


def _api_app(settings: Settings, security: SecurityHeaders) -> web.Application:
    """Build the internal /api sub-application, where every middleware lives."""
    api = web.Application(client_max_size=MAX_BODY_BYTES)
    limits = settings.limits
    routes = {
        # The square fails open (a local bucket) when Redis is gone: browsing is
        # harmless. Sign-in fails closed: it sends mail and guards accounts.
        "square_list": RouteLimit((limits["gallery"],), fail_open=True),
        "square_item": RouteLimit((limits["gallery"],), fail_open=True),
        "auth_code": RouteLimit((limits["code-ip"],), fail_open=False),
        "auth_verify": RouteLimit((limits["verify-ip"],), fail_open=False),
    }
    # Order matters, outermost first:
    # 1. remembered denials: names the client (trusted proxies only) and answers
    #    one Redis already refused from memory, so a flood costs the least;
    # 2. errors: every failure below it (unknown paths, wrong methods, a dead
    #    Redis, crashes) becomes {"error": CODE} with no internal detail;
    # 3. csrf: a cross-origin state change is refused before anything runs;
    # 4. ratelimit: charges the route's per-client buckets before any body is
    #    read or the store touched;
    # 5. sessions: a route not marked @anonymous answers 401 NO_SESSION before
    #    its handler runs, so a new route is guarded without anyone remembering.
    # Security and RateLimit headers ride on on_response_prepare, so they reach
    # every answer, 429s and errors included.
    setup_remembered_denials(
        api,
        routes=routes,
        trusted_proxies=settings.trusted_proxies,
        security=security,
    )
    setup_errors(api)
    setup_csrf(api, origin=settings.base_url)
    setup_ratelimit(api, routes=routes)
    setup_sessions(api, secure=settings.https)
    setup_headers(api, security)
    setup_auth_routes(api)
    setup_square_routes(api)
    return api


async def freeze_startup_objects(app: web.Application) -> None:
    """Move everything built at start-up out of the garbage collector's sight.

    The rendered documents, templates and modules live as long as the process;
    leaving them in the tracked generations makes every full collection walk
    them again. Production entry points call this once the app has started.
    """
    gc.collect()
    gc.freeze()


def create_app(
    settings: Settings, *, content: Content | None = None
) -> web.Application:
    """Render everything public once, then wire the API and its resources."""
    if not settings.redis_url:
        raise SettingsError(f"{variable('redis_url')}: required")
    content = content or load_content()
    # The public surface serves prepared bytes: no middleware, no per-request
    # signal, on the root app. Everything dynamic lives in the /api sub-app.
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[SETTINGS] = settings
    app[CONTENT] = content

    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(("html", "xml")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    css = (TEMPLATES_DIR / "site.css").read_text()
    security = SecurityHeaders(https=settings.https, csp=content_security_policy(css))
    context = _template_context(settings, content, css)
    base_url = settings.base_url
    documents = render_documents(env, content, context, base_url, security)
    files = render_machine_files(env, content, context, base_url, security)
    handlers = {name: document_handler(doc) for name, doc in documents.items()}
    handlers |= {name: _static_handler(rep) for name, rep in files.items()}

    setup_public_routes(app, handlers)
    app.add_subapp("/api", _api_app(settings, security))
    public_paths = frozenset(route.path for route in PUBLIC_ROUTES)
    app.router.add_route(
        "*",
        "/{tail:.*}",
        fallback_handler(_error_pages(env, context, security), public_paths),
        name="fallback",
    )
    app.cleanup_ctx.extend([redis_ctx, limiter_ctx, mailer_ctx])
    return app
