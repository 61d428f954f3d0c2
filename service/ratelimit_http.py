"""Rate limits at the /api boundary: who the client is, which buckets, which headers."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from .client_ip import IPNetwork, client_address, subject_of
from .errors import ApiError
from .keys import CLIENT, DECISIONS, LIMITER
from .ratelimit import Decision, LimiterUnavailable, Policy

_LOGGER: Final = logging.getLogger(__name__)
PROBLEM_TYPE: Final = "https://iana.org/assignments/http-problem-types#quota-exceeded"
UNAVAILABLE_RETRY_AFTER: Final = "5"


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """The per-client policies of one route, and what to do if Redis is gone."""

    policies: tuple[Policy, ...]
    fail_open: bool


def rate_limited(decision: Decision) -> ApiError:
    """Build the 429: problem+json, Retry-After rounded up, never cached."""
    retry_after = decision.retry_after
    return ApiError(
        429,
        "RATE_LIMITED",
        headers={hdrs.RETRY_AFTER: str(retry_after)},
        content_type="application/problem+json",
        type=PROBLEM_TYPE,
        title="Too Many Requests",
        status=429,
        detail=f"Rate limit exceeded. Retry in {retry_after} seconds.",
        **{"violated-policies": [s.policy.name for s in decision.states if s.denied]},
        retry_after=retry_after,
    )


async def enforce(
    request: web.Request, subject: str, policies: Sequence[Policy], *, fail_open: bool
) -> None:
    """Charge a subject's policies for this request, or raise 429 (or 503)."""
    app = request.config_dict
    try:
        decision = await app[LIMITER].check(subject, policies)
    except LimiterUnavailable:
        if not fail_open:
            _LOGGER.warning("limiter unavailable: refusing %s", request.rel_url.path)
            raise ApiError(
                503, "UNAVAILABLE", headers={hdrs.RETRY_AFTER: UNAVAILABLE_RETRY_AFTER}
            ) from None
        decision = app[LIMITER].local.check(subject, policies)
    request.setdefault(DECISIONS, []).append(decision)
    if not decision.allowed:
        raise rate_limited(decision)


async def refund(
    request: web.Request, subject: str, policies: Sequence[Policy]
) -> None:
    """Give a subject its tokens back; a failure here only costs the client a wait."""
    try:
        await request.config_dict[LIMITER].refund(subject, policies)
    except LimiterUnavailable:
        _LOGGER.warning("could not refund %s", ",".join(p.name for p in policies))


def setup_ratelimit(
    app: web.Application,
    *,
    routes: Mapping[str, RouteLimit],
    trusted_proxies: Sequence[IPNetwork],
) -> None:
    """Limit the named routes per client address before their handlers run."""

    @web.middleware
    async def ratelimit_middleware(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Name the client, then charge the route's per-client buckets."""
        request[CLIENT] = subject_of(client_address(request, trusted_proxies))
        route = request.match_info.route
        if (limit := routes.get(route.name or "")) is not None:
            await enforce(
                request, request[CLIENT], limit.policies, fail_open=limit.fail_open
            )
        return await handler(request)

    async def add_headers(request: web.Request, response: web.StreamResponse) -> None:
        """Report every policy evaluated for this request (draft -10 syntax)."""
        decisions = request.get(DECISIONS)
        if not decisions:
            return
        states = [state for decision in decisions for state in decision.states]
        response.headers["RateLimit-Policy"] = ", ".join(
            s.policy.header() for s in states
        )
        response.headers["RateLimit"] = ", ".join(s.header() for s in states)
        # Per-client numbers must not be stored by shared caches.
        cache = response.headers.get(hdrs.CACHE_CONTROL, "")
        if "no-store" not in cache and "private" not in cache:
            response.headers[hdrs.CACHE_CONTROL] = (
                f"private, {cache}" if cache else "private"
            )

    app.middlewares.append(ratelimit_middleware)
    app.on_response_prepare.append(add_headers)
