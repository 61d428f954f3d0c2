"""Buying credits over /api: the packs, and orders that lead the buyer to a provider."""

from __future__ import annotations

import datetime as dt
import json
import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import aiohttp
from aiohttp import hdrs, web

from ..api.boundary import ApiBoundary
from ..api.errors import ApiError
from ..api.payloads import json_response, read_idempotency, read_json
from ..api.query import bad_field, list_params, read_cursor
from ..auth.sessions import SESSION, anonymous
from ..keys import CONTENT, REDIS, SETTINGS
from ..limits.client_ip import client_address
from ..limits.http import enforce
from ..metrics import METRICS
from ..studio.ledger import AccountDeleting, UnknownAccount, account_key
from . import orders
from .keys import ORDERS, PROVIDERS
from .orders import IdempotencyKeyReused, Pack
from .providers.base import Checkout, Provider, ProviderError
from .reconciler import ask

_LOGGER: Final = logging.getLogger(__name__)
# The channels the documents name, in the order the workbench offers them.
CHANNELS: Final = ("alipay", "wechatpay")
DEVICES: Final = ("desktop", "mobile")
# Routes whose handlers charge a per-account write limit (headers on every answer).
ORDER_LIMITED: Final = frozenset({"orders_create"})
_ORDER_FIELDS: Final = frozenset({"pack", "channel", "device"})
# A reader of a `created` order asks its provider at most this often.
ASK_EVERY_SECONDS: Final = 5.0
PROVIDER_RETRY_AFTER: Final = "5"


def _account(request: web.Request) -> str:
    return request[SESSION].account_id


def _packs(request: web.Request) -> dict[str, Pack]:
    return {pack.id: pack for pack in orders.packs_of(request.app[CONTENT])}


@anonymous
async def list_packs(request: web.Request) -> web.StreamResponse:
    """List the packs of site.toml and which channels take payments now."""
    providers = request.app[PROVIDERS]
    return json_response(
        {
            "packs": [
                {
                    "id": pack.id,
                    "yuan": pack.yuan,
                    "credits": pack.credits,
                    "bonus": pack.bonus,
                }
                for pack in _packs(request).values()
            ],
            "channels": [
                {"id": channel, "available": channel in providers}
                for channel in CHANNELS
            ],
        }
    )


def _choice(body: Mapping[str, Any], name: str, allowed: Mapping[str, Any]) -> str:
    value = body[name]
    if not isinstance(value, str) or value not in allowed:
        raise bad_field(name)
    return value


def _checkout(request: web.Request, fields: Mapping[str, str], pack: Pack) -> Checkout:
    """Describe an order to its provider: amount, words, where to come back."""
    app = request.app
    settings = app[SETTINGS]
    base = settings.base_url
    oid = fields["id"]
    name = app[CONTENT].site.get("name_zh", "")
    return Checkout(
        order_id=oid,
        fen=int(fields["fen"]),
        subject=f"{name} {pack.credits + pack.bonus} 积分".strip(),
        device=fields["device"],
        client_ip=client_address(request, settings.trusted_proxies) or "127.0.0.1",
        notify_url=f"{base}/webhooks/{fields['channel']}",
        return_url=f"{base}/studio?order={oid}#buy",
        expires_at=dt.datetime.fromtimestamp(int(fields["expires"]), dt.UTC),
    )


async def create_order(request: web.Request) -> web.StreamResponse:
    """Open an order for a pack and lead the buyer to the channel's payment page."""
    app = request.app
    body = await read_json(request, required=_ORDER_FIELDS, name_field=True)
    account = _account(request)
    await enforce(
        request, f"acct:{account}", [app[SETTINGS].limits["orders"]], fail_open=False
    )
    idempotency, body_hash = read_idempotency(request, body)
    packs = _packs(request)
    pack = packs[_choice(body, "pack", packs)]
    channel = _choice(body, "channel", dict.fromkeys(CHANNELS))
    device = _choice(body, "device", dict.fromkeys(DEVICES))
    provider = app[PROVIDERS].get(channel)
    if provider is None:
        raise ApiError(400, "CHANNEL_UNAVAILABLE")
    store = app[ORDERS]
    try:
        fields, replayed = await store.create(
            account,
            pack,
            channel,
            device,
            idempotency_key=idempotency,
            body_hash=body_hash,
        )
    except IdempotencyKeyReused:
        raise ApiError(422, "IDEMPOTENCY_KEY_REUSED") from None
    except UnknownAccount:  # the account was deleted meanwhile
        raise ApiError(401, "NO_SESSION") from None
    except AccountDeleting:  # a request that raced "delete my account"
        raise ApiError(409, "ACCOUNT_DELETING") from None
    order = orders.view(fields, time.time())
    if order["status"] == "created":
        order["action"] = await _action(request, provider, fields, pack, replayed)
    response = json_response(order, status=200 if replayed else 201)
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
    return response


async def _action(
    request: web.Request,
    provider: Provider,
    fields: Mapping[str, str],
    pack: Pack,
    replayed: bool,
) -> dict[str, str]:
    """Ask the provider to start the payment (once); if it cannot, close the order.

    The action is kept with the order: a replay answers it again, and the QR
    code route draws its code_url.

    The order is closed (expired, its Idempotency-Key released) rather than
    left `created`: nobody can pay it, the buyer's list should not offer it,
    and a retry with the same key must try the provider again, not replay a
    dead order.
    """
    app = request.app
    if stored := fields.get("action"):
        return dict(json.loads(stored))
    try:
        action = await provider.create(_checkout(request, fields, pack))
    except (ProviderError, aiohttp.ClientError, TimeoutError) as err:
        _LOGGER.warning(
            "%s could not create order %s: %s",
            provider.id,
            fields["id"],
            getattr(err, "code", type(err).__name__),
        )
        app[METRICS].notices.labels(provider.id, "create_failed").inc()
        if not replayed:
            await _abandon(request, fields)
        raise ApiError(
            503,
            "PROVIDER_UNAVAILABLE",
            headers={hdrs.RETRY_AFTER: PROVIDER_RETRY_AFTER},
        ) from None
    shown = action.as_json()
    await app[ORDERS].keep_action(fields["id"], shown)  # the QR is drawn from it
    return shown


async def _abandon(request: web.Request, fields: Mapping[str, str]) -> None:
    """Close an order no provider took: expired now, off the open set, key free."""
    app = request.app
    oid = fields["id"]
    store = app[ORDERS]
    await store.expire(oid, max(time.time(), float(fields["expires"])))
    await store.forget_open(oid)
    if key := request.headers.get("Idempotency-Key", ""):
        name = f"{account_key(_account(request))}:idem:order:{key}"
        seen = await app[REDIS].get(name)
        if seen is not None and json.loads(seen).get("o") == oid:
            await app[REDIS].delete(name)


async def list_orders(request: web.Request) -> web.StreamResponse:
    """List my orders, newest first."""
    limit, cursor = list_params(request.query, frozenset())
    before = read_cursor(cursor, "o")
    items, last = await request.app[ORDERS].page(
        _account(request), before=before, limit=limit
    )
    now = time.time()
    return json_response(
        {
            "items": [orders.view(item, now) for item in items],
            "next_cursor": f"o{last}" if last else None,
        }
    )


async def get_order(request: web.Request) -> web.StreamResponse:
    """Show one of my orders; a `created` one asks its provider first (every 5 s)."""
    app = request.app
    oid = request.match_info["oid"]
    if orders.account_of(oid) != _account(request):
        raise ApiError(404, "NOT_FOUND")
    store = app[ORDERS]
    fields = await store.get(oid)
    if fields is None:
        raise ApiError(404, "NOT_FOUND")
    provider = app[PROVIDERS].get(fields.get("channel", ""))
    if fields.get("status") == "created" and provider is not None:
        now = time.time()
        if await store.mark_asked(oid, now, every=ASK_EVERY_SECONDS):
            try:
                if await ask(store, provider, oid) == "credited":
                    fields = await store.get(oid) or fields
            except ProviderError as err:  # the notice or the reconciler will tell
                _LOGGER.info("%s not asked about %s: %s", provider.id, oid, err.code)
    return json_response(orders.view(fields, time.time()))


def setup_order_routes(api: ApiBoundary) -> None:
    """Register the packs and orders endpoints behind the /api boundary."""
    api.add_routes(
        [
            web.get("/packs", list_packs, name="packs"),
            web.post("/orders", create_order, name="orders_create"),
            web.get("/orders", list_orders, name="orders_list"),
            web.get("/orders/{oid}", get_order, name="order"),
        ]
    )
