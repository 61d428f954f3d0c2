"""Build the application: one factory for `serve`, `dev` and the tests."""

from __future__ import annotations

import gc
from http import HTTPStatus
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp_jinja2
import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from .account.deletion_routes import deletions_ctx, setup_deletion_routes
from .account.export_routes import EXPORT_LIMITED, exports_ctx, setup_export_routes
from .api.boundary import ApiBoundary
from .api.cookies_layer import setup_cookie_bound
from .api.csrf import setup_csrf
from .api.errors import FALLBACK, fallback_handler, setup_errors
from .auth.endpoints import setup_auth_routes
from .auth.mailer import mailer_ctx
from .auth.session_cache import session_cache_ctx
from .auth.sessions import setup_sessions
from .clock import Clock, utc_now
from .content import Content, Model, content_for
from .keys import CLOCK, CONTENT, METRICS, PUBLISHED, SECURITY, SETTINGS
from .limits.http import (
    RouteLimit,
    setup_rate_headers,
    setup_ratelimit,
    setup_remembered_denials,
)
from .metrics import Metrics, metrics_ctx, setup_request_metrics
from .payments.context import payments_ctx
from .payments.endpoints import ORDER_LIMITED, setup_order_routes
from .payments.qrcode import setup_qrcode_routes
from .payments.webhooks import setup_webhook_routes
from .settings import Settings, SettingsError, resource_dir, variable
from .square.feed import VERSION as SQUARE_VERSION, setup_square_routes
from .square.page import work_page_handler
from .store.clients import limiter_ctx, redis_ctx
from .studio.context import (
    EMBEDDED_WORKER,
    embedded_worker_ctx,
    end_event_streams,
    studio_ctx,
)
from .studio.endpoints import ACCOUNT_LIMITED, setup_studio_routes
from .studio.library import LIBRARY_LIMITED, setup_library_routes
from .studio.media.serving import setup_media_routes
from .web.discovery import render_machine_files
from .web.documents import HTML_TYPE, document_handler, render_documents
from .web.headers import SecurityHeaders, content_security_policy, setup_headers
from .web.openapi import media_for
from .web.published import Published
from .web.representation import Representation, prepare, respond
from .web.routes import PUBLIC_ROUTES, setup_public_routes
from .web.workbench import setup_workbench_routes

TEMPLATES_DIR: Final = resource_dir("templates")
# Internal JSON bodies are small; anything bigger is refused with 413 before parsing.
MAX_BODY_BYTES: Final = 16 * 1024
# What every connection's handler is built with, under `serve` and in the tests
# alike: bodies as sent (their readers decode them: service/api/codings.py), and
# handlers that run to their end when a client leaves (aiohttp's default, which
# its test server changes, hiding what a departed client does to a handler).
HANDLER_ARGS: Final = {"auto_decompress": False, "handler_cancellation": False}


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


def _api(
    settings: Settings, security: SecurityHeaders, metrics: Metrics
) -> ApiBoundary:
    """Build the internal API: its layers, in order, and its routes."""
    api = ApiBoundary()
    limits = settings.limits
    routes = {
        # The square fails open (a local bucket) when Redis is gone: browsing is
        # harmless. Sign-in fails closed: it sends mail and guards accounts.
        # The square's version rides along with the gallery decision, so a
        # cached page is checked against removals at no extra round trip.
        "square_list": RouteLimit(
            (limits["gallery"],), fail_open=True, read_along=SQUARE_VERSION
        ),
        "square_item": RouteLimit(
            (limits["gallery"],), fail_open=True, read_along=SQUARE_VERSION
        ),
        "auth_code": RouteLimit((limits["code-ip"],), fail_open=False),
        "auth_verify": RouteLimit((limits["verify-ip"],), fail_open=False),
        # A deletion spends a code like verify does, from the same bucket.
        "account_delete": RouteLimit((limits["verify-ip"],), fail_open=False),
    }
    # Order matters, outermost first. Each layer is composed around each route's
    # handler once, at start-up, and leaves out the routes it has no business with.
    # 0. metrics: every answer counted by route and status, remembered 429s too;
    # 1. remembered denials (limited routes): names the client (trusted proxies
    #    only) and answers one Redis already refused from memory, so a flood
    #    costs the least;
    # 2. rate headers (limited routes): RateLimit-Policy and RateLimit on
    #    whatever comes back, 429s and errors included;
    # 3. security headers: on every answer, errors included;
    # 4. errors: every failure below (a dead Redis, a domain error, a crash)
    #    becomes {"error": CODE} with no internal detail;
    # 5. cookie bound: a Cookie header over 4 KB answers 400 before anything parses
    #    it; HTTP/1.0 with Transfer-Encoding answers 400 and the connection closes;
    # 6. csrf (state-changing routes): a cross-origin request is refused before
    #    anything runs;
    # 7. ratelimit (limited routes): charges the per-client buckets before any
    #    body is read or the store touched;
    # 8. sessions: a route not marked @anonymous answers 401 NO_SESSION before
    #    its handler runs, so a new route is guarded without anyone remembering.
    # Unknown /api paths and wrong methods are the root fallback's: JSON 404/405.
    setup_request_metrics(api, metrics)
    setup_remembered_denials(
        api,
        routes=routes,
        trusted_proxies=settings.trusted_proxies,
        security=security,
    )
    # Per-account write limits are charged inside their handlers, after the
    # session; their headers are reported by the same layer.
    setup_rate_headers(
        api,
        names=set(routes)
        | ACCOUNT_LIMITED
        | LIBRARY_LIMITED
        | ORDER_LIMITED
        | EXPORT_LIMITED,
    )
    setup_headers(api, security)
    setup_errors(api)
    setup_cookie_bound(api)
    setup_csrf(api, origin=settings.base_url)
    setup_ratelimit(api, routes=routes)
    setup_sessions(api, secure=settings.https)
    setup_auth_routes(api)
    setup_square_routes(api)
    setup_studio_routes(api)
    setup_library_routes(api)
    setup_order_routes(api)
    setup_qrcode_routes(api)
    setup_deletion_routes(api)
    setup_export_routes(api)
    return api


def _origin(url: str) -> str:
    """Return scheme://host[:port] of a URL, or "" for none."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


async def freeze_startup_objects(app: web.Application) -> None:
    """Move everything built at start-up out of the garbage collector's sight.

    The rendered documents, templates and modules live as long as the process;
    leaving them in the tracked generations makes every full collection walk
    them again. Production entry points call this once the app has started.
    """
    gc.collect()
    gc.freeze()


def create_app(
    settings: Settings,
    *,
    content: Content | None = None,
    embedded_worker: bool = False,
    clock: Clock = utc_now,
) -> web.Application:
    """Render everything public once, then wire the API and its resources."""
    if not settings.redis_url:
        raise SettingsError(f"{variable('redis_url')}: required")
    content = content or content_for(settings)
    # The public surface serves prepared bytes: no aiohttp middleware and no
    # per-request signal anywhere. Everything dynamic sits behind ApiBoundary.
    app = web.Application(client_max_size=MAX_BODY_BYTES, handler_args=HANDLER_ARGS)
    app[SETTINGS] = settings
    app[CONTENT] = content
    app[EMBEDDED_WORKER] = embedded_worker
    app[CLOCK] = clock

    env = aiohttp_jinja2.setup(
        app,
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(("html", "xml")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    css = (TEMPLATES_DIR / "site.css").read_text()
    media_origin = _origin(settings.workbench.media_public_url)
    security = SecurityHeaders(
        https=settings.https, csp=content_security_policy(css, media_origin)
    )
    context = _template_context(settings, content, css)
    base_url = settings.base_url

    def render(offered: tuple[Model, ...]) -> dict[str, Handler]:
        """Render every public document and file for the models on offer."""
        today = {**context, "models": offered}
        documents = render_documents(env, content, today, base_url, security)
        files = render_machine_files(env, content, today, base_url, security)
        handlers = {name: document_handler(doc) for name, doc in documents.items()}
        return handlers | {name: _static_handler(rep) for name, rep in files.items()}

    # Rendered again, without a restart, at the midnight a model retires.
    published = app[PUBLISHED] = Published(content, render, clock)

    app[SECURITY] = security
    setup_public_routes(app, published.handlers())
    setup_media_routes(app)
    setup_workbench_routes(app, env, context, security)
    metrics = app[METRICS] = Metrics()
    _api(settings, security, metrics).install(app)
    error_pages = _error_pages(env, context, security)
    not_found = web.Response(
        body=error_pages[404].body, headers=error_pages[404].headers
    )
    app.router.add_get(
        "/square/{work_id}",
        work_page_handler(env, context, security, not_found),
        name="square_page",
    )
    # The providers' notices: outside /api (no session, no cross-origin check).
    setup_webhook_routes(app)
    if settings.payments.fake:  # its pages and gateways; never in production
        from .payments.fake import setup_fake_provider

        setup_fake_provider(app)
    app.router.add_route(
        "*", "/{tail:.*}", fallback_handler(error_pages, security), name=FALLBACK
    )
    app.cleanup_ctx.extend(
        [
            redis_ctx,
            session_cache_ctx,
            limiter_ctx,
            mailer_ctx,
            studio_ctx,
            deletions_ctx,
            exports_ctx,
            payments_ctx,
            embedded_worker_ctx,
            metrics_ctx,
            published.ctx,
        ]
    )
    app.on_shutdown.append(end_event_streams)
    return app
