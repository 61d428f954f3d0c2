"""Build the application: one factory for `serve`, `dev` and the tests."""

from __future__ import annotations

import gc
from typing import Final

from aiohttp import web

from .account.setup import setup as setup_account
from .api.boundary import API, ApiBoundary
from .api.setup import install as install_api, setup as setup_api
from .auth.setup import setup as setup_auth
from .clock import Clock, utc_now
from .content import Content, content_for
from .heap import release_freed_memory
from .keys import CLOCK, CONTENT, SETTINGS
from .limits.setup import setup as setup_limits
from .metrics import setup as setup_metrics
from .moderation.setup import setup as setup_moderation
from .payments.setup import setup as setup_payments
from .settings import Settings, SettingsError, variable
from .square.setup import setup as setup_square
from .store.setup import setup as setup_store
from .studio.context import EMBEDDED_WORKER
from .studio.setup import setup as setup_studio
from .web.setup import setup as setup_web

# Internal JSON bodies are small; anything bigger is refused with 413 before parsing.
MAX_BODY_BYTES: Final = 16 * 1024
# What every connection's handler is built with, under `serve` and in the tests
# alike: bodies as sent (their readers decode them: service/api/codings.py), and
# handlers that run to their end when a client leaves (aiohttp's default, which
# its test server changes, hiding what a departed client does to a handler).
HANDLER_ARGS: Final = {"auto_decompress": False, "handler_cancellation": False}


def _api() -> ApiBoundary:
    """Build the internal API's boundary: its layers, in order (routes come later)."""
    # Order matters, outermost first. Each layer is composed around each route's
    # handler once, at start-up, and leaves out the routes it has no business with.
    # 0. metrics: every answer counted by route and status, remembered 429s too;
    # 1. remembered denials (limited routes): names the client (trusted proxies
    #    only) and answers one Redis already refused from memory, so a flood
    #    costs the least (not a request 5 or 6 refuses: their answer comes first);
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
    return ApiBoundary(
        order=(
            "metrics",
            "remembered_denials",
            "rate_headers",
            "security_headers",
            "errors",
            "cookie_bound",
            "csrf",
            "ratelimit",
            "sessions",
        )
    )


# Python's default, 700 new containers, is crossed inside one turn of the loop
# when many submits arrive together (each allocates dozens before any is
# freed): a collection every 40 submits, 0.4 ms each, walking every request in
# flight, 11.6 µs of CPU a submit in all. Little of it is garbage: reference
# counting frees nearly everything. At 10,000, none ran in 14,000 submits
# (docs/performance.md).
YOUNG_COLLECTION_THRESHOLD: Final = 10_000


async def freeze_startup_objects(app: web.Application) -> None:
    """Move everything built at start-up out of the garbage collector's sight,
    and let young objects pile up longer before a collection.

    The rendered documents, templates and modules live as long as the process;
    leaving them in the tracked generations makes every full collection walk
    them again. Production entry points call this once the app has started.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, *gc.get_threshold()[1:])
    release_freed_memory()  # what rendering the documents took and let go


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
    app = web.Application(client_max_size=MAX_BODY_BYTES, handler_args=HANDLER_ARGS)
    app[SETTINGS] = settings
    app[CONTENT] = content or content_for(settings)
    app[EMBEDDED_WORKER] = embedded_worker
    app[CLOCK] = clock
    app[API] = _api()
    # The concerns, each registering its own keys, routes, layers (at their place
    # in _api) and resources. Resources open in this order, close in reverse:
    setup_store(app)  # the Redis client, before any store is built on it
    setup_web(app)  # every public page rendered once; security headers
    setup_api(app)  # errors, the cookie bound, csrf
    setup_limits(app)  # the limiter; the routes it guards come from the concerns
    setup_square(app)  # its store, before the studio's works that publish to it
    setup_moderation(app)  # the word list submit and publish check; its log
    setup_studio(app)  # the ledger, queue, media, upstreams, events, worker
    setup_auth(app)  # accounts open in the studio's ledger; the session layer
    setup_payments(app)  # orders credit the ledger; the providers' notices
    setup_account(app)  # my export and my deletion reach all of the above
    setup_metrics(app)  # after the studio: it watches the studio's queue depth
    # Last: the /api routes, wrapped in their layers, then the catch-all fallback.
    install_api(app)
    return app
