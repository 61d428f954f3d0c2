"""Rate limits at the /api boundary: who the client is, which buckets, which headers."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from typing import Any, Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler

from ..api.boundary import ApiBoundary, route_name
from ..api.cookies_layer import bound_refuses
from ..api.csrf import cross_origin, state_changing
from ..api.errors import UNAVAILABLE_RETRY_AFTER, ApiError
from ..metrics import METRICS
from ..web.headers import SecurityHeaders
from ..web.representation import PreparedResponse, Variant
from .client_ip import ClientNamer, IPNetwork
from .keys import CLIENT, DECISIONS, DEGRADED, LIMITER, READ_ALONG
from .limiter import (
    MICROS,
    Decision,
    Limiter,
    LimiterUnavailable,
    MemoKey,
    Policy,
    shifted,
)

_LOGGER: Final = logging.getLogger(__name__)
PROBLEM_TYPE: Final = "https://iana.org/assignments/http-problem-types#quota-exceeded"


@dataclass(frozen=True, slots=True)
class RouteLimit:
    """The per-client policies of one route, and what to do if Redis is gone."""

    policies: tuple[Policy, ...]
    fail_open: bool
    # A key whose value the route's handler needs, read in the limiter's round
    # trip (request[READ_ALONG]); None where the limiter could not be asked.
    read_along: str = ""


def _problem(decision: Decision) -> dict[str, Any]:
    retry_after = decision.retry_after
    return {
        "type": PROBLEM_TYPE,
        "title": "Too Many Requests",
        "status": 429,
        "detail": f"Rate limit exceeded. Retry in {retry_after} seconds.",
        "violated-policies": [s.policy.name for s in decision.states if s.denied],
        "retry_after": retry_after,
    }


def rate_limited(decision: Decision) -> ApiError:
    """Build the 429: problem+json, Retry-After rounded up, never cached."""
    return ApiError(
        429,
        "RATE_LIMITED",
        headers={hdrs.RETRY_AFTER: str(decision.retry_after)},
        content_type="application/problem+json",
        **_problem(decision),
    )


def rate_headers(decisions: Sequence[Decision]) -> dict[str, str]:
    """Render RateLimit-Policy and RateLimit for every policy evaluated."""
    if len(decisions) == 1 and len(only := decisions[0].states) == 1:
        (state,) = only  # most routes: one policy, rendered without joins
        return {"RateLimit-Policy": state.policy.rendered, "RateLimit": state.header()}
    states = [state for decision in decisions for state in decision.states]
    return {
        "RateLimit-Policy": ", ".join(s.policy.header() for s in states),
        "RateLimit": ", ".join(s.header() for s in states),
    }


class _RememberedDenials:
    """Whole 429 answers for clients that Redis already refused, one per second left.

    A single-policy denial's headers and body depend only on the whole seconds
    left, so while a client floods, its answer is built once per second, and
    sent with a head serialized once (PreparedResponse), as public documents are.
    """

    def __init__(self, security: SecurityHeaders, max_entries: int = 10_000) -> None:
        self._security = security
        # memo key -> (whole seconds left, the answer) of the last answer built
        self._answers: dict[MemoKey, tuple[int, Variant]] = {}
        self._max = max_entries

    def answer(
        self, memo_key: MemoKey, denial: Decision, elapsed_us: int
    ) -> web.Response:
        """Answer a remembered denial, building it only once per second left."""
        seconds = max(1, -(-(denial.worst_retry_us - elapsed_us) // MICROS))
        cached = self._answers.get(memo_key)
        if cached is None or cached[0] != seconds:
            if cached is None and len(self._answers) >= self._max:
                self._answers.clear()
            decision = shifted(denial, elapsed_us)
            body = json.dumps({**_problem(decision), "error": "RATE_LIMITED"}).encode()
            headers = {
                hdrs.CONTENT_TYPE: "application/problem+json",
                hdrs.CACHE_CONTROL: "no-store",
                hdrs.RETRY_AFTER: str(decision.retry_after),
                **rate_headers([decision]),
                **self._security.for_type("application/problem+json"),
            }
            answer = Variant(body=body, headers=headers, status=429)
            cached = self._answers[memo_key] = (seconds, answer)
        return PreparedResponse(cached[1])


async def enforce(
    request: web.Request,
    subject: str,
    policies: Sequence[Policy],
    *,
    fail_open: bool,
    read_along: str = "",
) -> None:
    """Charge a subject's policies for this request, or raise 429 (or 503)."""
    app = request.app
    try:
        decision, value = await app[LIMITER].check_reading(
            subject, policies, read_along
        )
        if read_along:
            request[READ_ALONG] = value
    except LimiterUnavailable:
        app[METRICS].decisions["fallback"].inc()
        if not fail_open:
            _LOGGER.warning("limiter unavailable: refusing %s", request.rel_url.path)
            raise ApiError(
                503, "UNAVAILABLE", headers={hdrs.RETRY_AFTER: UNAVAILABLE_RETRY_AFTER}
            ) from None
        decision = app[LIMITER].local.check(subject, policies)
        request[DEGRADED] = True
    if (decisions := request.get(DECISIONS)) is None:
        request[DECISIONS] = [decision]
    else:
        decisions.append(decision)
    app[METRICS].decisions["allowed" if decision.allowed else "denied"].inc()
    if not decision.allowed:
        raise rate_limited(decision)


async def refund(
    request: web.Request, subject: str, policies: Sequence[Policy]
) -> None:
    """Give a subject its tokens back; a failure here only costs the client a wait.

    The answer's RateLimit then shows them back too (the request's decisions).
    """
    try:
        await request.app[LIMITER].refund(subject, policies)
    except LimiterUnavailable:
        _LOGGER.warning("could not refund %s", ",".join(p.name for p in policies))
        return
    if decisions := request.get(DECISIONS):
        names = {policy.name for policy in policies}
        request[DECISIONS] = [decision.refunded(names) for decision in decisions]


def setup_remembered_denials(
    api: ApiBoundary,
    *,
    routes: Mapping[str, RouteLimit],
    trusted_proxies: Sequence[IPNetwork],
    security: SecurityHeaders,
    origin: str,
) -> None:
    """Name the client of a limited route, and answer one Redis already refused.

    A flooding client is the one worth answering cheapest: its 429 comes from
    memory, built once per second, ahead of every other layer. A request the
    layers below refuse anyway (an oversized Cookie, a cross-origin write) is
    passed on to them: their 400 or 403 comes before any limit (CONTRACT §3).
    """
    denials = _RememberedDenials(security)
    namer = ClientNamer(trusted_proxies)

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if (limit := routes.get(route_name(route))) is None:
            return handler
        # Only a single-policy denial is remembered (the limiter asks Redis
        # again for the others, whose buckets move), and it reads the same for
        # a whole second.
        names = tuple(p.name for p in limit.policies)
        single = len(names) == 1
        guarded = state_changing(route)
        limiter: Limiter | None = None  # the app's, looked up once it exists

        async def remembered(request: web.Request) -> web.StreamResponse:
            """Answer a remembered denial whole; otherwise pass the named client on."""
            nonlocal limiter
            subject = namer.subject(request)
            if single:
                if limiter is None:
                    limiter = request.app[LIMITER]
                memo_key = (subject, names)
                if (
                    (memo := limiter.remembered(memo_key)) is not None
                    and not bound_refuses(request)
                    and not (guarded and cross_origin(request, origin))
                ):
                    return denials.answer(memo_key, *memo)
            # What the layers below fill in, present from the start: reading
            # a missing key costs MutableMapping a KeyError raised and caught.
            request[CLIENT], request[DECISIONS], request[DEGRADED] = subject, [], False
            return await handler(request)

        return remembered

    api.add_layer(layer)


def setup_rate_headers(api: ApiBoundary, *, names: Set[str]) -> None:
    """Report every policy a limited route evaluated, on whatever answer it gives."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if route_name(route) not in names:
            return handler

        async def reported(request: web.Request) -> web.StreamResponse:
            """Add RateLimit-Policy and RateLimit (draft -10 syntax)."""
            response = await handler(request)
            if decisions := request.get(DECISIONS):
                headers = response.headers
                headers.update(rate_headers(decisions))
                # Per-client numbers must not be stored by shared caches.
                cache = headers.get(hdrs.CACHE_CONTROL, "")
                if "no-store" not in cache and "private" not in cache:
                    headers[hdrs.CACHE_CONTROL] = (
                        f"private, {cache}" if cache else "private"
                    )
            return response

        return reported

    api.add_layer(layer)


def setup_ratelimit(api: ApiBoundary, *, routes: Mapping[str, RouteLimit]) -> None:
    """Charge a limited route's per-client buckets before its handler runs."""

    def layer(route: web.RouteDef, handler: Handler) -> Handler:
        if (limit := routes.get(route_name(route))) is None:
            return handler
        policies, fail_open, read_along = (
            limit.policies,
            limit.fail_open,
            limit.read_along,
        )

        async def limited(request: web.Request) -> web.StreamResponse:
            """Charge the buckets of the client named by the outer layer."""
            await enforce(
                request,
                request[CLIENT],
                policies,
                fail_open=fail_open,
                read_along=read_along,
            )
            return await handler(request)

        return limited

    api.add_layer(layer)
