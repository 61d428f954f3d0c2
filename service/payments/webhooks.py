"""The providers' payment notices: verified first, then applied once, then answered.

`POST /webhooks/alipay` and `POST /webhooks/wechatpay` sit outside /api: no
session, no cross-origin check (the caller is a provider's server), their own
64 KiB body limit, and they are no part of the public contract. A notice whose
signature, merchant, time or amount is wrong changes nothing and gets a 4xx; a
store that cannot be reached gets 503, so the provider sends it again later.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Mapping
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Handler
from aiohttp.web_protocol import RequestPayloadError

from ..api.codings import body_coding, decode_body
from ..api.errors import CLIENT_CLOSED, UNAVAILABLE_RETRY_AFTER, ApiError, client_gone
from ..keys import REDIS
from ..metrics import METRICS
from ..store.connect import STORE_ERRORS
from ..studio.ledger import UnknownAccount
from ..web.keys import SECURITY
from .keys import ORDERS, PROVIDERS
from .orders import (
    AmountMismatch,
    NotRefundable,
    OrderStore,
    UnknownOrder,
    order_key,
)
from .providers.base import BadNotice, Notice, Provider

_LOGGER: Final = logging.getLogger(__name__)
MAX_NOTICE_BYTES: Final = 64 * 1024
# A notice body must be whole this long after it starts arriving.
READ_SECONDS: Final = 10.0
WEBHOOK_PREFIX: Final = "/webhooks/"


class _Refused(Exception):
    """A notice answered with a 4xx: nothing changed."""

    def __init__(self, status: int, code: str) -> None:
        super().__init__(code)
        self.status = status
        self.code = code


def _error(
    request: web.Request,
    status: int,
    code: str,
    headers: Mapping[str, str] | None = None,
) -> web.Response:
    return web.json_response(
        {"error": code},
        status=status,
        headers={
            **request.app[SECURITY].common,
            hdrs.CACHE_CONTROL: "no-store",
            **(headers or {}),
        },
    )


async def _body(request: web.Request) -> bytes:
    """Read the raw body (signatures cover its exact bytes), at most 64 KiB."""
    if (request.content_length or 0) > MAX_NOTICE_BYTES:
        raise _Refused(413, "PAYLOAD_TOO_LARGE")
    try:
        coding = body_coding(request)
    except ApiError as err:
        raise _Refused(err.status, err.code) from None
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(READ_SECONDS):
            while chunk := await request.content.readany():
                size += len(chunk)
                if size > MAX_NOTICE_BYTES:
                    raise _Refused(413, "PAYLOAD_TOO_LARGE")
                chunks.append(chunk)
    except TimeoutError:
        raise _Refused(408, "REQUEST_TIMEOUT") from None
    except RequestPayloadError:
        raise _Refused(400, "BAD_REQUEST") from None
    except ConnectionResetError:
        if client_gone(request):  # the sender left mid-body: not a store outage
            raise _Refused(CLIENT_CLOSED, "CLIENT_CLOSED_REQUEST") from None
        raise
    try:
        return decode_body(b"".join(chunks), coding, MAX_NOTICE_BYTES)
    except ApiError as err:
        raise _Refused(err.status, err.code) from None


def notice_handler(provider_id: str) -> Handler:
    """Build the webhook of one provider."""

    async def receive(request: web.Request) -> web.StreamResponse:
        """Verify a notice, apply it once, answer as the provider expects."""
        app = request.app
        counter = app[METRICS].notices
        provider = app[PROVIDERS].get(provider_id)
        if provider is None:  # the channel is not configured here
            return _error(request, 404, "NOT_FOUND")
        try:
            body = await _body(request)
            outcome = await _handle(request, provider, body)
        except _Refused as refused:
            counter.labels(provider_id, refused.code.lower()).inc()
            return _error(request, refused.status, refused.code)
        except STORE_ERRORS as err:
            _LOGGER.warning(
                "%s notice not handled, store unavailable: %s",
                provider_id,
                type(err).__name__,
            )
            counter.labels(provider_id, "unavailable").inc()
            return _error(
                request,
                503,
                "UNAVAILABLE",
                {hdrs.RETRY_AFTER: UNAVAILABLE_RETRY_AFTER},
            )
        except Exception:
            _LOGGER.exception("%s notice crashed", provider_id)
            counter.labels(provider_id, "internal_error").inc()
            return _error(request, 500, "INTERNAL_ERROR")
        counter.labels(provider_id, outcome).inc()
        response = provider.acknowledge()
        response.headers.update(app[SECURITY].common)
        return response

    return receive


async def _handle(request: web.Request, provider: Provider, body: bytes) -> str:
    """Apply a notice; return what it did, or raise _Refused."""
    app = request.app
    store = app[ORDERS]
    try:
        notice = provider.verify_notice(request.headers, body, time.time())
    except BadNotice as bad:
        _LOGGER.info("%s notice refused: %s", provider.id, bad.code)
        await store.record_notice(provider.id, "", "", verified=False, outcome=bad.code)
        raise _Refused(400, bad.code) from None
    oid = notice.order_id
    if await store.handled(provider.id, notice.event_id):
        return "duplicate"
    fields = await store.get(oid)
    refusal = ""
    if fields is None:
        refusal = "UNKNOWN_ORDER"
    elif fields["channel"] != provider.id or notice.total_fen != int(fields["fen"]):
        refusal = "MISMATCH"
    if not refusal:
        try:
            outcome = await _apply(request, store, notice)
        except AmountMismatch:
            refusal = "MISMATCH"
        except UnknownOrder:  # gone between the read and the change
            refusal = "UNKNOWN_ORDER"
    if refusal:
        _LOGGER.warning("%s notice for %s refused: %s", provider.id, oid, refusal)
        await store.record_notice(
            provider.id, notice.event_id, oid, verified=True, outcome=refusal
        )
        raise _Refused(400, refusal)
    await store.record_notice(
        provider.id, notice.event_id, oid, verified=True, outcome="ok"
    )
    return outcome


async def _apply(request: web.Request, store: OrderStore, notice: Notice) -> str:
    """Credit a payment once; take back what a provider-side refund returned."""
    oid = notice.order_id
    if notice.kind == "other":
        return "ignored"
    if notice.kind == "refund_failed":
        # The money did not move: the credits stay taken, and only a person can
        # pay the buyer (the merchant platform's 退款异常, or a new refund).
        _LOGGER.error(
            "order %s: refund %s ABNORMAL or CLOSED at %s: the buyer has not been"
            " paid; settle it in the merchant platform",
            oid,
            notice.refund_id,
            notice.provider,
        )
        return "refund_failed"
    # A refund proves the payment: one delivered out of order credits it first.
    try:
        credited = await store.pay(oid, notice.trade_no, notice.total_fen)
    except UnknownAccount:
        # Acknowledged, so the provider stops resending: there is no account to
        # credit, and the money must be refunded from the provider's console.
        _LOGGER.warning("order %s paid after its account was purged: refund it", oid)
        return "account_gone"
    if credited:
        _LOGGER.info("order %s paid (%s notice)", oid, notice.provider)
    if notice.kind == "paid":
        return "credited" if credited else "repeated"
    own = await store.own_refund(oid) if notice.refund_id else None
    cumulative = await _cumulative(request, notice, own)
    try:
        taken = await store.provider_refunded(oid, cumulative)
    except NotRefundable:  # cannot happen once paid above; nothing to take
        return "ignored"
    if taken:
        _LOGGER.info("order %s refunded at %s: %d credits", oid, notice.provider, taken)
    if own is not None and notice.refund_id == own[0]:
        with contextlib.suppress(NotRefundable):  # our refund, confirmed: done
            await store.finish_refund(oid)
    return "refunded" if taken else "refund_seen"


async def _cumulative(
    request: web.Request, notice: Notice, own: tuple[str, int] | None
) -> int:
    """The money refunded on the order so far, as the notices tell it.

    Alipay states the cumulative figure. WeChat states one refund at a time
    (named by its out_refund_no): each is kept, and their sum is the figure,
    so a repeat or an older notice arriving late changes nothing. Our own
    refund counts whether or not its notice ever came: a console refund's
    notice must not be mistaken for it.
    """
    if not notice.refund_id:
        return notice.refunded_fen
    redis = request.app[REDIS]
    key = f"{order_key(notice.order_id)}:refunds"
    if own is not None:
        await redis.hsetnx(key, *own)
    await redis.hset(key, notice.refund_id, notice.refunded_fen)
    amounts = await redis.hvals(key)
    return sum(int(amount) for amount in amounts)


def setup_webhook_routes(app: web.Application) -> None:
    """Register the notice endpoints on the app, outside /api."""
    for provider_id in ("alipay", "wechatpay"):
        app.router.add_post(
            f"{WEBHOOK_PREFIX}{provider_id}",
            notice_handler(provider_id),
            name=f"webhook_{provider_id}",
        )
