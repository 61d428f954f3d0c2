"""Buying credits over HTTP: packs, orders, idempotency, limits, on the real app."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis

from service.app import create_app
from service.payments.fake import trade_key
from service.payments.orders import order_key
from service.store.embedded import MailCatcher

from .conftest import SettingsFactory, forget_limits
from .shop import Shop, buy, credits, get_order, open_shop, pay
from .workbench import sign_in


async def test_packs_list_site_toml_and_the_configured_channels(shop: Shop) -> None:
    """Anonymous, unlimited, in site.toml's order; both channels configured."""
    shop.client.session.cookie_jar.clear()
    response = await shop.client.get("/api/packs")
    assert response.status == 200
    assert "RateLimit" not in response.headers
    assert await response.json() == {
        "packs": [
            {"id": "p30", "yuan": 30, "credits": 300, "bonus": 0},
            {"id": "p98", "yuan": 98, "credits": 980, "bonus": 80},
            {"id": "p298", "yuan": 298, "credits": 2980, "bonus": 420},
            {"id": "p998", "yuan": 998, "credits": 9980, "bonus": 2020},
        ],
        "channels": [
            {"id": "alipay", "available": True},
            {"id": "wechatpay", "available": True},
        ],
    }


async def test_without_settings_no_channel_is_available_and_orders_are_refused(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
) -> None:
    """No channel settings and no fake: CHANNEL_UNAVAILABLE, nothing stored."""
    client = await aiohttp_client(create_app(make_settings()))
    body = await (await client.get("/api/packs")).json()
    assert body["channels"] == [
        {"id": "alipay", "available": False},
        {"id": "wechatpay", "available": False},
    ]
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/orders", json={"pack": "p30", "channel": "wechatpay", "device": "mobile"}
    )
    assert response.status == 400
    assert await response.json() == {"error": "CHANNEL_UNAVAILABLE"}
    assert [key async for key in redis.scan_iter("studio:acct:*:order:*")] == []


@pytest.mark.parametrize(
    ("channel", "device", "action_type"),
    [
        ("alipay", "desktop", "redirect"),
        ("alipay", "mobile", "redirect"),
        ("wechatpay", "desktop", "qrcode"),
        ("wechatpay", "mobile", "redirect"),
    ],
)
async def test_an_order_leads_to_its_channel_and_paying_it_credits_once(
    shop: Shop, channel: str, device: str, action_type: str
) -> None:
    """201 created with the channel's action; paying on the provider's page credits."""
    before = (await credits(shop.client))["balance"]
    order = await buy(shop.client, "p98", channel, device)
    assert set(order) == {
        "id", "pack", "yuan", "credits", "bonus", "channel", "status",
        "refunded_yuan", "created_at", "paid_at", "expires_at", "action",
    }  # fmt: skip
    assert order["action"]["type"] == action_type
    assert (order["pack"], order["yuan"], order["credits"], order["bonus"]) == (
        "p98",
        98,
        980,
        80,
    )
    assert (order["status"], order["refunded_yuan"], order["paid_at"]) == (
        "created",
        "0.00",
        None,
    )
    me = await (await shop.client.get("/api/me")).json()
    assert order["id"][:24] == me["id"]
    await pay(shop, order)
    shown = await get_order(shop.client, order["id"])
    assert shown["status"] == "paid"
    assert shown["paid_at"] is not None
    after = await credits(shop.client)
    assert after["balance"] == before + 1060
    purchases = [e for e in after["entries"] if e["kind"] == "purchase"]
    assert [(e["amount"], e["order_id"]) for e in purchases] == [(1060, order["id"])]
    lots = [lot for lot in after["lots"] if lot["kind"] == "purchase"]
    assert [(lot["granted"], lot["order_id"]) for lot in lots] == [(1060, order["id"])]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"pack": "p99", "channel": "alipay", "device": "desktop"}, "pack"),
        ({"pack": 98, "channel": "alipay", "device": "desktop"}, "pack"),
        ({"pack": "p98", "channel": "paypal", "device": "desktop"}, "channel"),
        ({"pack": "p98", "channel": "alipay", "device": "pc"}, "device"),
        ({"pack": "p98", "channel": "alipay", "device": None}, "device"),
        ({"pack": "p98", "channel": "alipay"}, "device"),
        ({"pack": "p98", "channel": "alipay", "device": "desktop", "x": 1}, "x"),
    ],
)
async def test_a_bad_order_body_names_its_field(
    shop: Shop, redis: Redis, body: dict[str, Any], field: str
) -> None:
    """Unknown fields, missing fields and bad values: 400 with the field."""
    response = await shop.client.post("/api/orders", json=body)
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST", "field": field}
    assert [key async for key in redis.scan_iter("studio:acct:*:order:*")] == []


async def test_malformed_order_requests_get_json_errors(shop: Shop) -> None:
    """Not JSON, not an object, not application/json, too big: never a 500."""
    cases = [
        ({"data": b"{", "headers": {"Content-Type": "application/json"}}, 400),
        ({"data": b"[]", "headers": {"Content-Type": "application/json"}}, 400),
        ({"data": b"pack=p98", "headers": {"Content-Type": "text/plain"}}, 415),
        (
            {
                "data": b'{"pack":"' + b"x" * 20000 + b'"}',
                "headers": {"Content-Type": "application/json"},
            },
            413,
        ),
    ]
    for kwargs, status in cases:
        response = await shop.client.post("/api/orders", **kwargs)  # type: ignore[arg-type]
        assert response.status == status
        assert "error" in await response.json()


async def test_orders_need_a_session_and_pass_the_cross_origin_check(
    shop: Shop,
) -> None:
    """403 for a cross-site form, 401 without a session, before the body is read."""
    body = {"pack": "p98", "channel": "alipay", "device": "desktop"}
    response = await shop.client.post(
        "/api/orders", json=body, headers={"Sec-Fetch-Site": "cross-site"}
    )
    assert (response.status, await response.json()) == (403, {"error": "CROSS_ORIGIN"})
    shop.client.session.cookie_jar.clear()
    for method, path in (
        ("POST", "/api/orders"),
        ("GET", "/api/orders"),
        ("GET", "/api/orders/" + "0" * 32),
    ):
        response = await shop.client.request(method, path, json=body)
        assert (response.status, await response.json()) == (
            401,
            {"error": "NO_SESSION"},
        )


async def test_an_idempotency_key_replays_the_order_and_refuses_another_body(
    shop: Shop, redis: Redis
) -> None:
    """Same key and body: the same order, 200 replayed; another body: 422."""
    key = {"Idempotency-Key": "buy-once-1"}
    first = await buy(shop.client, "p30", "wechatpay", "desktop", headers=key)
    again = await shop.client.post(
        "/api/orders",
        data=json.dumps({"device": "desktop", "channel": "wechatpay", "pack": "p30"}),
        headers={**key, "Content-Type": "application/json"},
    )
    assert again.status == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert await again.json() == first
    other = await shop.client.post(
        "/api/orders",
        json={"pack": "p98", "channel": "wechatpay", "device": "desktop"},
        headers=key,
    )
    assert (other.status, await other.json()) == (
        422,
        {"error": "IDEMPOTENCY_KEY_REUSED"},
    )
    bad = await shop.client.post(
        "/api/orders",
        json={"pack": "p98", "channel": "wechatpay", "device": "desktop"},
        headers={"Idempotency-Key": "é"},
    )
    assert await bad.json() == {"error": "BAD_REQUEST", "field": "Idempotency-Key"}
    listed = await (await shop.client.get("/api/orders")).json()
    assert [item["id"] for item in listed["items"]] == [first["id"]]


async def test_orders_are_limited_per_account_with_the_limiter_headers(
    shop: Shop, redis: Redis
) -> None:
    """The orders policy (20 an hour, 10 at once): the eleventh at once gets 429."""
    await forget_limits(redis)
    body = {"pack": "p30", "channel": "alipay", "device": "desktop"}
    answers = await asyncio.gather(
        *(shop.client.post("/api/orders", json=body) for _ in range(12))
    )
    statuses = sorted(response.status for response in answers)
    assert statuses == [201] * 10 + [429] * 2
    refused = next(r for r in answers if r.status == 429)
    assert (await refused.json())["error"] == "RATE_LIMITED"
    assert "orders" in refused.headers["RateLimit-Policy"]
    assert int(refused.headers["Retry-After"]) >= 1
    accepted = next(r for r in answers if r.status == 201)
    assert "RateLimit" in accepted.headers


async def test_orders_are_listed_newest_first_page_by_page(shop: Shop) -> None:
    """Cursor o<n>, limit 1-50; pages neither repeat nor skip."""
    made = [(await buy(shop.client, "p30"))["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = ""
    while True:
        response = await shop.client.get(f"/api/orders?limit=2&cursor={cursor}")
        assert response.status == 200
        body = await response.json()
        seen += [item["id"] for item in body["items"]]
        if body["next_cursor"] is None:
            break
        assert body["next_cursor"].startswith("o")
        cursor = body["next_cursor"]
    assert seen == list(reversed(made))
    for query, field in (
        ("limit=0", "limit"),
        ("limit=51", "limit"),
        ("cursor=g5", "cursor"),
        ("cursor=o", "cursor"),
        ("sort=new", "sort"),
    ):
        response = await shop.client.get(f"/api/orders?{query}")
        assert (response.status, await response.json()) == (
            400,
            {"error": "BAD_REQUEST", "field": field},
        )


async def test_someone_elses_order_is_not_found(
    shop: Shop, mail_server: MailCatcher
) -> None:
    """Another account's order, a malformed id and a missing one: 404 alike."""
    order = await buy(shop.client)
    await sign_in(shop.client, mail_server)  # someone else, same browser
    me = await (await shop.client.get("/api/me")).json()
    for oid in (order["id"], "nope", me["id"] + "00000000", order["id"].upper()):
        response = await shop.client.get(f"/api/orders/{oid}")
        assert (response.status, await response.json()) == (
            404,
            {"error": "NOT_FOUND"},
        )
    listed = await (await shop.client.get("/api/orders")).json()
    assert listed == {"items": [], "next_cursor": None}


async def test_reading_an_order_asks_the_provider_so_a_return_page_sees_the_payment(
    shop: Shop, redis: Redis
) -> None:
    """The notice is lost; GET /api/orders/{id} asks the provider and credits it."""
    order = await buy(shop.client, "p30", "wechatpay", "desktop")
    oid = order["id"]
    assert (await get_order(shop.client, oid))["status"] == "created"  # asked: unpaid
    await redis.hset(trade_key(oid), "notify_url", "http://127.0.0.1:9/webhooks")
    delivery = await shop.gateway.pay(oid)  # its notice goes nowhere
    assert delivery is not None
    assert delivery.status == 0
    # Within 5 s of the last question the provider is not asked again.
    assert (await get_order(shop.client, oid))["status"] == "created"
    asked = float(await redis.hget(order_key(oid), "asked") or 0)
    await redis.hset(order_key(oid), "asked", asked - 5)
    shown = await get_order(shop.client, oid)
    assert shown["status"] == "paid"
    assert (await credits(shop.client))["balance"] == 100 + 300


async def test_a_provider_that_cannot_create_the_order_answers_503_and_closes_it(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
) -> None:
    """WeChat's gateway is gone: 503 PROVIDER_UNAVAILABLE; the order is expired."""
    async with open_shop(
        aiohttp_server,
        aiohttp_client,
        make_settings,
        redis,
        STUDIO_PAYMENTS_WECHATPAY_BASE_URL="http://127.0.0.1:9/fake-pay/wechatpay",
    ) as shop:
        await sign_in(shop.client, mail_server)
        key = {"Idempotency-Key": "k-503"}
        body = {"pack": "p98", "channel": "wechatpay", "device": "desktop"}
        response = await shop.client.post("/api/orders", json=body, headers=key)
        assert response.status == 503
        assert await response.json() == {"error": "PROVIDER_UNAVAILABLE"}
        assert response.headers["Retry-After"]
        listed = (await (await shop.client.get("/api/orders")).json())["items"]
        assert [item["status"] for item in listed] == ["expired"]
        assert await redis.zcard("studio:orders:open") == 0
        # The same key tries the provider again rather than replaying a dead order.
        again = await shop.client.post("/api/orders", json=body, headers=key)
        assert again.status == 503


async def test_credits_owed_shows_in_me(shop: Shop, redis: Redis) -> None:
    """/api/me carries credits_owed (0 until a provider refund outruns the balance)."""
    me = await (await shop.client.get("/api/me")).json()
    assert me["credits_owed"] == 0
    await redis.hset(f"studio:acct:{{{me['id']}}}", "owed", 7)
    me = await (await shop.client.get("/api/me")).json()
    assert me["credits_owed"] == 7
    assert (await credits(shop.client))["credits_owed"] == 7
