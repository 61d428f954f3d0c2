"""Ask for proof of work before sign-in mail when the budget is low or a network noisy.

The design (issue #15, CONTRACT §3 "Sign-in under attack"):

- Two pairs of buckets guard `POST /api/auth/code`. For the client's network
  (IPv4 /24, IPv6 /48): `code-net` bounds every request, `code-net-free` the
  ones that bring no proof of work. For the whole service: `mail-global` is the
  relay's budget, `mail-free` the part of it anyone may spend without work. A
  request without a solved challenge is charged both buckets of a pair in one
  all-or-nothing call; a solved one only the outer bucket. So however many
  addresses a flood comes from, requests without work never spend more than
  `mail-free`: the rest of `mail-global` is a reserve that only solvers reach.
- Before anything is charged, one pipelined round trip peeks (cost 0) at both
  pairs. If a free bucket is empty, the request must carry a solved challenge:
  429 `{"error": "CHALLENGE_REQUIRED", "challenge": {...}}` with `Retry-After: 0`.
  The address is not looked at and no per-address quota is touched, so known
  and unknown addresses get the same answer, and a client that does not solve
  spends nobody's quota. (Concurrent requests that all saw a token left are
  settled by the all-or-nothing charge, which answers the same 429.)
- The challenge is ALTCHA proof of work v2, PBKDF2/SHA-256 with 1,000
  iterations per try, in deterministic mode: the server draws the counter below
  a ceiling and the client must find it (about ceiling / 2 tries). The ceiling
  rises with pressure, the larger spent share of `code-net` or `mail-global`,
  from 1,000 (a fraction of a second in a browser) to 20,000 (a few seconds).
- Challenges are HMAC-signed with keys derived from the secret key and expire
  after 5 minutes. A solution is spent once: its challenge's signature is set
  in Redis (SET NX) until the challenge expires. A bad, expired or replayed
  solution gets the same 429 with a new challenge.
- Work buys a place in the reserve, not a way past per-client limits: a solver
  still pays `code-ip`, `code-net` and the per-address quotas, plus the CPU of
  one challenge per mail.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import math
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Final

from aiohttp import hdrs, web
from altcha import Payload, create_challenge, verify_solution
from redis.exceptions import RedisError

from ..api.errors import UNAVAILABLE_RETRY_AFTER, ApiError
from ..keys import REDIS, SETTINGS
from ..limits.client_ip import network_of
from ..limits.http import enforce, refund
from ..limits.keys import CLIENT, DECISIONS, LIMITER
from ..limits.limiter import Decision, LimiterUnavailable, Policy
from ..store.deadline import within

_LOGGER: Final = logging.getLogger(__name__)
ALGORITHM: Final = "PBKDF2/SHA-256"
# PBKDF2 iterations per try; the server spends one derivation per challenge.
COST: Final = 1_000
# The counter's ceiling at no pressure and at full pressure.
MIN_CEILING: Final = 1_000
MAX_CEILING: Final = 20_000
CHALLENGE_TTL_SECONDS: Final = 300
# Setting a spent solution's mark waits this long for Redis, then fails closed.
SPEND_BUDGET_SECONDS: Final = 0.5
# (network bucket pair, mail bucket pair): the free bucket first, then the outer one.
NETWORK_POLICIES: Final = ("code-net-free", "code-net")
MAIL_POLICIES: Final = ("mail-free", "mail-global")
FREE: Final = frozenset({NETWORK_POLICIES[0], MAIL_POLICIES[0]})
MAIL_SUBJECT: Final = "all"


@dataclass(frozen=True, slots=True)
class Keys:
    """The HMAC keys of challenges and of their solutions' derived keys."""

    challenge: bytes
    derived: bytes


@lru_cache(maxsize=4)
def keys_for(secret_key: str) -> Keys:
    """Derive the challenge keys from the secret key, apart from its other uses."""
    base = secret_key.encode()

    def derive(label: bytes) -> bytes:
        return hmac.new(base, b"studio altcha v1 " + label, hashlib.sha256).digest()

    return Keys(derive(b"challenge"), derive(b"derived key"))


def ceiling(pressure: float) -> int:
    """Return the counter's ceiling: geometric from MIN to MAX as pressure goes 0-1."""
    pressure = min(1.0, max(0.0, pressure))
    return round(MIN_CEILING * math.pow(MAX_CEILING / MIN_CEILING, pressure))


def pressure_of(decisions: Sequence[Decision]) -> float:
    """Return the largest spent share of an outer bucket (code-net, mail-global)."""
    shares = [
        1 - state.remaining / state.policy.burst
        for decision in decisions
        for state in decision.states
        if state.policy.name not in FREE
    ]
    return max(shares, default=0.0)


def new_challenge(keys: Keys, pressure: float) -> dict[str, Any]:
    """Draw a signed challenge whose work rises with pressure."""
    challenge = create_challenge(
        ALGORITHM,
        COST,
        counter=secrets.randbelow(ceiling(pressure)),
        expires_at=int(time.time()) + CHALLENGE_TTL_SECONDS,
        hmac_secret=keys.challenge,
        hmac_key_secret=keys.derived,
    )
    return challenge.to_dict()


def challenge_required(keys: Keys, pressure: float) -> ApiError:
    """Build the 429 that carries a new challenge; the client may retry at once."""
    return ApiError(
        429,
        "CHALLENGE_REQUIRED",
        headers={hdrs.RETRY_AFTER: "0"},
        challenge=new_challenge(keys, pressure),
    )


def solved_signature(payload: str, keys: Keys) -> tuple[str, int] | None:
    """Return the signature and expiry of our challenge this payload solves, or None."""
    try:
        parsed = Payload.from_base64(payload)
        result = verify_solution(parsed, keys.challenge, hmac_key_secret=keys.derived)
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None  # not base64, not JSON, not the payload's shape
    expires_at = parsed.challenge.parameters.expires_at
    if not result.verified or not isinstance(expires_at, int):
        return None
    return str(parsed.challenge.signature), expires_at


def spent_key(signature: str) -> str:
    """Name the mark of a solved challenge."""
    return f"studio:altcha:v1:{signature}"


async def spend_once(request: web.Request, signature: str, expires_at: int) -> bool:
    """Mark a solution spent; tell whether this was its first use (fails closed)."""
    ttl_ms = max(1000, expires_at * 1000 - int(time.time() * 1000))
    try:
        first = await within(
            SPEND_BUDGET_SECONDS,
            request.app[REDIS].set(spent_key(signature), b"1", nx=True, px=ttl_ms),
        )
    except (RedisError, OSError, TimeoutError):
        _LOGGER.warning("could not mark a challenge solution spent")
        raise _unavailable() from None
    return bool(first)


def _unavailable() -> ApiError:
    return ApiError(
        503, "UNAVAILABLE", headers={hdrs.RETRY_AFTER: UNAVAILABLE_RETRY_AFTER}
    )


@dataclass(frozen=True, slots=True)
class Admission:
    """A code request let through to its charges: its network, and if it did work."""

    network: str
    solved: bool

    def charges(self, limits: Mapping[str, Policy]) -> list[tuple[str, list[Policy]]]:
        """Return (subject, policies) to charge: a solver skips the free buckets."""
        skip = 1 if self.solved else 0
        return [
            (self.network, [limits[n] for n in NETWORK_POLICIES[skip:]]),
            (MAIL_SUBJECT, [limits[n] for n in MAIL_POLICIES[skip:]]),
        ]


async def _peek(
    request: web.Request, network: str, limits: Mapping[str, Policy]
) -> list[Decision]:
    """Read both bucket pairs without spending, in one pipelined round trip."""
    limiter = request.app[LIMITER]
    try:
        return list(
            await asyncio.gather(
                limiter.check(network, [limits[n] for n in NETWORK_POLICIES], cost=0),
                limiter.check(MAIL_SUBJECT, [limits[n] for n in MAIL_POLICIES], cost=0),
            )
        )
    except LimiterUnavailable:
        _LOGGER.warning("limiter unavailable: refusing a code request")
        raise _unavailable() from None


async def screen(request: web.Request, altcha: object) -> Admission:
    """Admit a code request, or raise 429 CHALLENGE_REQUIRED with a new challenge.

    Nothing is charged here; the address plays no part.
    """
    if altcha is not None and not isinstance(altcha, str):
        raise ApiError(400, "BAD_REQUEST")
    app = request.app
    settings = app[SETTINGS]
    keys = keys_for(settings.secret_key)
    network = network_of(request[CLIENT])
    peeked = await _peek(request, network, settings.limits)
    if altcha is not None:
        solved = solved_signature(altcha, keys)
        if solved is not None and await spend_once(request, *solved):
            return Admission(network, solved=True)
        raise challenge_required(keys, pressure_of(peeked))
    free_left = [
        state.remaining
        for decision in peeked
        for state in decision.states
        if state.policy.name in FREE
    ]
    if min(free_left) < 1:
        raise challenge_required(keys, pressure_of(peeked))
    return Admission(network, solved=False)


async def charge(request: web.Request, admission: Admission) -> None:
    """Spend the network's and the mail budget's tokens, or raise 429 (or 503).

    A free bucket emptied by a concurrent request answers CHALLENGE_REQUIRED,
    an outer one RATE_LIMITED; a failed second charge gives the first one back.
    """
    settings = request.app[SETTINGS]
    charged: list[tuple[str, list[Policy]]] = []
    for subject, policies in admission.charges(settings.limits):
        try:
            await enforce(request, subject, policies, fail_open=False)
        except ApiError as err:
            for done_subject, done_policies in charged:
                await refund(request, done_subject, done_policies)
            violated = set(err.fields.get("violated-policies", ()))
            if err.code == "RATE_LIMITED" and violated and violated <= FREE:
                pressure = pressure_of(request.get(DECISIONS, [])[-1:])
                raise challenge_required(
                    keys_for(settings.secret_key), pressure
                ) from None
            raise
        charged.append((subject, policies))


async def give_back(request: web.Request, admission: Admission) -> None:
    """Return what charge spent: no mail went out."""
    for subject, policies in admission.charges(request.app[SETTINGS].limits):
        await refund(request, subject, policies)
