"""Payment notices at POST /webhooks/*: verified, applied once, refused when wrong."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import secrets
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlencode

import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis
from yarl import URL

from service.metrics import METRICS
from service.payments import signing
from service.payments.fake import Delivery, FakeGateway, trade_key
from service.payments.keys import ORDERS
from service.payments.orders import order_key
from service.payments.providers import alipay, wechatpay
from service.store.embedded import MailCatcher

from .chaos import HangingProxy
from .conftest import SettingsFactory
from .logs import crashes
from .payments import fake_keys, other_keys
from .ports import free_port
from .raw_http import abandon, exchange
from .shop import Shop, buy, checkout_page, credits, get_order, open_shop, pay
from .workbench import sign_in

# Where a notice goes when the test wants to hold it back and deliver it itself.
NOWHERE = "http://127.0.0.1:9/webhooks"


async def held_payment(shop: Shop, redis: Redis, channel: str) -> tuple[str, Delivery]:
    """Open an order and pay it at the provider, keeping its notice back."""
    order = await buy(shop.client, "p98", channel)
    oid = order["id"]
    await checkout_page(shop, order)  # the provider now knows the trade
    await redis.hset(trade_key(oid), "notify_url", NOWHERE)
    delivery = await shop.gateway.pay(oid)
    assert delivery is not None
    assert delivery.status == 0
    return oid, delivery


async def deliver(shop: Shop, delivery: Delivery) -> tuple[int, bytes]:
    """Send a notice to our webhook, as the provider would."""
    provider = "alipay" if b"notify_id" in delivery.body else "wechatpay"
    sent = await shop.gateway.deliver(
        dataclasses.replace(delivery, url=f"{shop.base_url}/webhooks/{provider}")
    )
    return sent.status, sent.answer


def acknowledged(channel: str, status: int, answer: bytes) -> bool:
    """The provider's own success answer: Alipay `success`, WeChat 204."""
    return (status, answer) == (
        (200, b"success") if channel == "alipay" else (204, b"")
    )


async def stored_status(redis: Redis, oid: str) -> str:
    """An order's status as stored (reading it over HTTP would ask the provider)."""
    status = await redis.hget(order_key(oid), "status")
    return status.decode() if isinstance(status, bytes) else str(status or "")


async def balance(shop: Shop) -> int:
    return int((await credits(shop.client))["balance"])


async def purchases(shop: Shop) -> list[dict[str, Any]]:
    entries = (await credits(shop.client))["entries"]
    return [e for e in entries if e["kind"] == "purchase"]


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_notice_resent_eight_times_credits_once(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """The provider's resends all get its success answer; one purchase."""
    oid, delivery = await held_payment(shop, redis, channel)
    for _ in range(8):
        status, answer = await deliver(shop, delivery)
        assert acknowledged(channel, status, answer), (status, answer)
    assert await balance(shop) == 100 + 1060
    assert [e["order_id"] for e in await purchases(shop)] == [oid]
    notices = await shop.client.app[ORDERS].notices()
    assert [n["outcome"] for n in notices if n["order_id"] == oid] == ["ok"]


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_concurrent_distinct_notices_of_one_payment_credit_once(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """Eight different notices (own event ids) for one payment, all at once."""
    oid, _ = await held_payment(shop, redis, channel)
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    if channel == "alipay":
        notices = [shop.gateway.alipay_notice(oid, trade) for _ in range(8)]
    else:
        notices = [shop.gateway.wechat_paid_notice(oid, trade) for _ in range(8)]
    answers = await asyncio.gather(*(deliver(shop, n) for n in notices))
    assert all(acknowledged(channel, s, a) for s, a in answers), answers
    assert await balance(shop) == 100 + 1060
    assert len(await purchases(shop)) == 1


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_refund_notice_before_the_payment_notice_credits_then_refunds(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """Out of order: the refund proves the payment; the late payment adds nothing."""
    oid, paid = await held_payment(shop, redis, channel)
    refunded = await shop.gateway.refund_from_console(oid, 1000)  # 10 yuan back
    assert refunded.status == 0  # held back too
    status, answer = await deliver(shop, refunded)
    assert acknowledged(channel, status, answer), (status, answer)
    order = await get_order(shop.client, oid)
    assert (order["status"], order["refunded_yuan"]) == ("refunded", "10.00")
    assert await balance(shop) == 100 + 1060 - 100
    status, answer = await deliver(shop, paid)
    assert acknowledged(channel, status, answer)
    assert await balance(shop) == 100 + 1060 - 100
    assert len(await purchases(shop)) == 1
    kinds = [e["kind"] for e in (await credits(shop.client))["entries"]]
    assert kinds.count("purchase_refund") == 1


async def test_wechat_refunds_add_up_by_refund_id_and_repeats_change_nothing(
    shop: Shop, redis: Redis
) -> None:
    """WeChat tells each refund alone: two refunds add up; a resend counts once."""
    oid, paid = await held_payment(shop, redis, "wechatpay")
    assert acknowledged("wechatpay", *await deliver(shop, paid))
    first = await shop.gateway.refund_from_console(oid, 1000)
    second = await shop.gateway.refund_from_console(oid, 2500)
    for notice in (second, first, second, first):
        assert acknowledged("wechatpay", *await deliver(shop, notice))
    order = await get_order(shop.client, oid)
    assert order["refunded_yuan"] == "25.00"
    assert await balance(shop) == 100 + 1060 - 250


def _alipay_form(delivery: Delivery) -> dict[str, str]:
    return dict(parse_qsl(delivery.body.decode()))


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_tampered_body_is_refused_and_nothing_is_credited(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """One changed byte of a signed notice: 400 BAD_SIGNATURE, audited unverified."""
    oid, delivery = await held_payment(shop, redis, channel)
    if channel == "alipay":
        form = _alipay_form(delivery)
        form["total_amount"] = "0.01"
        body = urlencode(form).encode()
    else:
        event = json.loads(delivery.body)
        event["event_type"] = "TRANSACTION.SUCCESS "
        body = json.dumps(event, ensure_ascii=False).encode()
    status, answer = await deliver(shop, dataclasses.replace(delivery, body=body))
    assert (status, json.loads(answer)) == (400, {"error": "BAD_SIGNATURE"})
    assert await balance(shop) == 100
    assert await stored_status(redis, oid) == "created"  # no provider asked
    audit = (await shop.client.app[ORDERS].notices())[0]
    assert (audit["verified"], audit["outcome"]) == ("0", "BAD_SIGNATURE")
    # The genuine notice still credits: the refusal was not remembered.
    assert acknowledged(channel, *await deliver(shop, delivery))
    assert await balance(shop) == 100 + 1060


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_notice_signed_with_another_key_is_refused(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """Someone else's key, our ids: 400 BAD_SIGNATURE, nothing credited."""
    oid, _ = await held_payment(shop, redis, channel)
    forger = FakeGateway(other_keys(), redis, shop.browser)
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    if channel == "alipay":
        forged = forger.alipay_notice(oid, trade)
    else:
        forged = forger.wechat_paid_notice(oid, trade)
    status, answer = await deliver(shop, forged)
    assert (status, json.loads(answer)) == (400, {"error": "BAD_SIGNATURE"})
    assert await balance(shop) == 100


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_notice_for_another_amount_is_refused_and_changes_nothing(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """Correctly signed, but 30 yuan for a 98-yuan order: 400 MISMATCH."""
    oid, _ = await held_payment(shop, redis, channel)
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    cheap = {**trade, "total": "3000"}
    if channel == "alipay":
        notice = shop.gateway.alipay_notice(oid, cheap)
    else:
        notice = shop.gateway.wechat_paid_notice(oid, cheap)
    status, answer = await deliver(shop, notice)
    assert (status, json.loads(answer)) == (400, {"error": "MISMATCH"})
    assert await balance(shop) == 100
    assert await stored_status(redis, oid) == "created"  # no provider asked
    audit = (await shop.client.app[ORDERS].notices())[0]
    assert (audit["order_id"], audit["verified"], audit["outcome"]) == (
        oid,
        "1",
        "MISMATCH",
    )


@pytest.mark.parametrize("channel", ["alipay", "wechatpay"])
async def test_a_notice_for_another_merchant_is_refused(
    shop: Shop, redis: Redis, channel: str
) -> None:
    """Signed with the provider's key but naming another seller or mchid: 400."""
    oid, _ = await held_payment(shop, redis, channel)
    keys = fake_keys()
    other = dataclasses.replace(
        keys,
        seller_id="2088999999999999",
        mchid="1999999999",
        appid="wx9999999999999999",
    )
    elsewhere = FakeGateway(other, redis, shop.browser)
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    if channel == "alipay":
        notice = elsewhere.alipay_notice(oid, trade)
    else:
        notice = elsewhere.wechat_paid_notice(oid, trade)
    status, answer = await deliver(shop, notice)
    assert (status, json.loads(answer)) == (400, {"error": "MISMATCH"})
    assert await balance(shop) == 100


async def test_a_stale_wechat_notice_is_refused(shop: Shop, redis: Redis) -> None:
    """A signature more than five minutes old: 400 STALE, nothing credited."""
    oid, _ = await held_payment(shop, redis, "wechatpay")
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    fresh = shop.gateway.wechat_paid_notice(oid, trade)
    stale = shop.gateway.wechat_notice(
        NOWHERE,
        "TRANSACTION.SUCCESS",
        "transaction",
        _paid_resource(shop.gateway, oid, trade),
        now=time.time() - 301,
    )
    status, answer = await deliver(shop, stale)
    assert (status, json.loads(answer)) == (400, {"error": "STALE"})
    assert await balance(shop) == 100
    assert acknowledged("wechatpay", *await deliver(shop, fresh))


def _paid_resource(
    gateway: FakeGateway, oid: str, trade: dict[str, str]
) -> dict[str, Any]:
    """The decrypted resource of a TRANSACTION.SUCCESS notice."""
    total = int(trade["total"])
    return {
        "mchid": gateway.keys.mchid,
        "appid": gateway.keys.appid,
        "out_trade_no": oid,
        "transaction_id": trade["trade_no"],
        "trade_type": "NATIVE",
        "trade_state": "SUCCESS",
        "success_time": "2026-01-01T00:00:00+08:00",
        "amount": {"total": total, "payer_total": total, "currency": "CNY"},
    }


async def test_an_unknown_order_is_refused(shop: Shop, redis: Redis) -> None:
    """A genuine notice for an order we never made: 400 UNKNOWN_ORDER."""
    me = await (await shop.client.get("/api/me")).json()
    ghost = me["id"] + "ffffffff"
    await shop.gateway.record(ghost, "alipay", 9800, "x", NOWHERE)
    notice = await shop.gateway.pay(ghost)
    assert notice is not None
    status, answer = await deliver(shop, notice)
    assert (status, json.loads(answer)) == (400, {"error": "UNKNOWN_ORDER"})
    assert await balance(shop) == 100


async def test_an_expired_order_paid_late_is_still_credited(
    shop: Shop, redis: Redis
) -> None:
    """The buyer paid after the 15 minutes: the money came, so do the credits."""
    oid, delivery = await held_payment(shop, redis, "alipay")
    past = int(time.time()) - 60
    await redis.hset(order_key(oid), "expires", past)
    assert await shop.client.app[ORDERS].expire(oid, time.time())
    assert (await get_order(shop.client, oid))["status"] == "expired"
    assert acknowledged("alipay", *await deliver(shop, delivery))
    assert (await get_order(shop.client, oid))["status"] == "paid"
    assert await balance(shop) == 100 + 1060


@pytest.fixture
async def metered_shop(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
) -> AsyncIterator[Shop]:
    """The shop with metrics on: the notices' outcomes are counted."""
    async with open_shop(
        aiohttp_server,
        aiohttp_client,
        make_settings,
        redis,
        STUDIO_METRICS_PORT=str(free_port()),
    ) as shop:
        yield shop


async def test_webhooks_sit_outside_the_api_and_refuse_big_bodies(
    metered_shop: Shop,
) -> None:
    """No session or cross-origin check; over 64 KiB: 413; not in /openapi.json;
    each refusal counted (metrics on)."""
    shop = metered_shop
    response = await shop.client.post(
        "/webhooks/alipay",
        data=b"a=1",
        headers={
            "Content-Type": "application/x-www-form-urlencoded",
            "Sec-Fetch-Site": "cross-site",
        },
    )
    assert (response.status, await response.json()) == (
        400,
        {"error": "BAD_SIGNATURE"},
    )
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    big = await shop.client.post(
        "/webhooks/wechatpay",
        data=b"{" + b" " * (64 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert (big.status, await big.json()) == (413, {"error": "PAYLOAD_TOO_LARGE"})
    # Just under the limit is read (and then refused for its signature).
    near = await shop.client.post(
        "/webhooks/wechatpay",
        data=b"{" + b" " * (60 * 1024) + b"}",
        headers={"Content-Type": "application/json"},
    )
    assert near.status == 400
    spec = await (await shop.client.get("/openapi.json")).json()
    assert not [path for path in spec["paths"] if "webhook" in path]
    assert (await shop.client.get("/webhooks/alipay")).status == 405
    exposition = shop.client.app[METRICS].exposition().decode()
    assert 'studio_payment_notices_total{outcome="payload_too_large"' in exposition


async def test_with_redis_down_a_notice_gets_503_and_its_resend_credits(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
    redis_server: Any,
) -> None:
    """The provider resends what was not acknowledged: nothing is lost."""
    proxy = HangingProxy(redis_server.port)
    await proxy.start()
    try:
        async with open_shop(
            aiohttp_server,
            aiohttp_client,
            make_settings,
            redis,
            STUDIO_REDIS_URL=proxy.url,
        ) as shop:
            await sign_in(shop.client, mail_server)
            oid, delivery = await held_payment(shop, redis, "wechatpay")
            await proxy.stop()  # Redis unreachable from the app
            status, answer = await deliver(shop, delivery)
            assert (status, json.loads(answer)) == (503, {"error": "UNAVAILABLE"})
            await proxy.start()
            assert (await redis.hget(order_key(oid), "status")) == b"created"
            status, answer = await deliver(shop, delivery)  # the resend
            assert acknowledged("wechatpay", status, answer), (status, answer)
            assert await balance(shop) == 100 + 1060
    finally:
        await proxy.stop()


async def test_the_event_stream_sends_the_order_when_it_is_paid(
    shop: Shop, redis: Redis
) -> None:
    """SSE `order` events carry the order's view; the paid one ends the wait."""
    events: list[tuple[str, Any]] = []
    opened = asyncio.Event()

    async def listen() -> None:
        async with shop.client.get("/api/events") as response:
            assert response.status == 200
            name = ""
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    opened.set()
                    data = events[-1][1]
                    if name == "order" and data["status"] == "paid":
                        return

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(opened.wait(), 10)
    order = await buy(shop.client, "p30", "wechatpay", "mobile")
    await pay(shop, order)
    await asyncio.wait_for(listener, 10)
    shown = [data for name, data in events if name == "order"]
    assert shown[-1] == await get_order(shop.client, order["id"])
    assert set(shown[-1]) == {
        "id", "pack", "yuan", "credits", "bonus", "channel", "status",
        "refunded_yuan", "created_at", "paid_at", "expires_at",
    }  # fmt: skip
    assert ("credits", {"balance": 400}) in events


async def raw_post(
    base_url: str, path: str, head: bytes, body: bytes
) -> tuple[int, bytes]:
    """POST with header bytes no HTTP client would send; the status and body."""
    host = URL(base_url).host
    answer = await exchange(
        base_url,
        f"POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n".encode()
        + head
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body,
    )
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.parametrize(
    "header",
    [
        b"Wechatpay-Timestamp",
        b"Wechatpay-Nonce",
        b"Wechatpay-Signature",
        b"Wechatpay-Serial",
        b"Wechatpay-Signature-Type",
    ],
)
async def test_undecodable_wechat_header_bytes_are_refused_with_a_400(
    shop: Shop, caplog: pytest.LogCaptureFixture, header: bytes
) -> None:
    """A non-UTF-8 byte in a signed header, with the (public) serial: 400, no crash."""
    keys = fake_keys()
    fields = {
        b"Content-Type": b"application/json",
        b"Wechatpay-Serial": keys.public_key_id.encode(),
        b"Wechatpay-Timestamp": str(int(time.time())).encode(),
        b"Wechatpay-Nonce": b"0123456789ABCDEF",
        b"Wechatpay-Signature": b"AAAA",
        b"Wechatpay-Signature-Type": wechatpay.SCHEME.encode(),
    }
    fields[header] = fields[header] + b"\xff\xfe"
    head = b"".join(name + b": " + value + b"\r\n" for name, value in fields.items())
    status, answer = await raw_post(shop.base_url, "/webhooks/wechatpay", head, b"{}")
    assert (status, json.loads(answer)) == (400, {"error": "BAD_SIGNATURE"})
    assert await balance(shop) == 100
    assert not crashes(caplog)


async def test_a_sender_that_leaves_mid_body_is_not_a_store_outage(
    metered_shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    """A notice cut short by a closed connection: counted as the client's, no
    warning, nothing applied."""
    shop = metered_shop
    await abandon(
        shop.base_url,
        b"POST /webhooks/alipay HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
        b"Content-Type: application/x-www-form-urlencoded\r\n\r\nnotify_id=1",
    )
    counted = 'outcome="client_closed_request",provider="alipay"} 1.0'
    for _ in range(250):
        if counted in shop.client.app[METRICS].exposition().decode():
            break
        await asyncio.sleep(0.02)
    assert counted in shop.client.app[METRICS].exposition().decode()
    assert "store unavailable" not in caplog.text


def signed_wechat_notice(
    shop: Shop, event: dict[str, Any], resource: dict[str, Any], stamp: str
) -> Delivery:
    """A WeChat notice signed with the provider's key, any text as its timestamp.

    JSON with ASCII escapes, so a lone surrogate travels as \\ud800, as any
    JSON encoder may send it; a string value "digits:N" becomes N digits.
    """
    keys = shop.gateway.keys
    nonce = secrets.token_hex(6)
    event = {
        "id": f"EV-{secrets.token_hex(10)}",
        "resource_type": "encrypt-resource",
        "event_type": "TRANSACTION.SUCCESS",
        **event,
        "resource": {
            "original_type": "transaction",
            "algorithm": "AEAD_AES_256_GCM",
            "ciphertext": signing.aes_gcm_encrypt(
                signing.aes_key(keys.apiv3_key),
                nonce,
                _with_digits(json.dumps(resource)).encode(),
                "transaction",
            ),
            "associated_data": "transaction",
            "nonce": nonce,
        },
    }
    body = _with_digits(json.dumps(event)).encode()
    once = wechatpay.nonce()
    platform = signing.load_private_key(keys.platform_private_pem)
    signature = signing.sign(platform, wechatpay.message(stamp, once, body))
    headers = {
        "Content-Type": "application/json",
        "Wechatpay-Timestamp": stamp,
        "Wechatpay-Nonce": once,
        "Wechatpay-Signature": signature,
        "Wechatpay-Serial": keys.public_key_id,
        "Wechatpay-Signature-Type": wechatpay.SCHEME,
    }
    return Delivery(url=NOWHERE, headers=headers, body=body)


def _with_digits(text: str) -> str:
    """Write "digits:N" as a number of N digits (json.dumps refuses such an int)."""
    return re.sub(r"\"digits:([0-9]+)\"", lambda m: "7" * int(m.group(1)), text)


@pytest.mark.parametrize(
    ("event", "resource", "stamp"),
    [
        pytest.param({}, {"out_trade_no": "\ud800"}, "", id="order-id-surrogate"),
        pytest.param({"id": "EV-\udfff"}, {}, "", id="event-id-surrogate"),
        pytest.param({}, {"transaction_id": "4200\ud83d"}, "", id="trade-no-surrogate"),
        pytest.param({}, {}, "\u00b2", id="stamp-superscript-two"),
        pytest.param({}, {}, "\u0661\u0667", id="stamp-arabic-digits"),
        pytest.param({}, {}, "1" * 5000, id="stamp-5000-digits"),
        pytest.param(
            {}, {"amount": {"total": "digits:5000"}}, "", id="total-5000-digits"
        ),
    ],
)
async def test_a_signed_wechat_notice_with_hostile_text_is_a_bad_request(
    shop: Shop,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
    event: dict[str, Any],
    resource: dict[str, Any],
    stamp: str,
) -> None:
    """Signed, but text no store takes or no clock reads: 400, nothing moves."""
    oid, _ = await held_payment(shop, redis, "wechatpay")
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    paid = {**_paid_resource(shop.gateway, oid, trade), **resource}
    notice = signed_wechat_notice(shop, event, paid, stamp or str(int(time.time())))
    status, answer = await deliver(shop, notice)
    assert (status, json.loads(answer)) == (400, {"error": "BAD_REQUEST"})
    assert await balance(shop) == 100
    assert await stored_status(redis, oid) == "created"
    assert not crashes(caplog)
    # The same payment, told plainly, still credits.
    fine = signed_wechat_notice(
        shop, {}, _paid_resource(shop.gateway, oid, trade), str(int(time.time()))
    )
    assert acknowledged("wechatpay", *await deliver(shop, fine))
    assert await balance(shop) == 100 + 1060


def signed_alipay_form(shop: Shop, delivery: Delivery, **changes: str) -> Delivery:
    """An Alipay notice with some fields changed, signed again with Alipay's key."""
    form = {**_alipay_form(delivery), **changes}
    form["sign"] = signing.sign(
        signing.load_private_key(shop.gateway.keys.alipay_private_pem),
        alipay.notice_content(form).encode(),
    )
    return dataclasses.replace(delivery, body=urlencode(form).encode())


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"total_amount": "9٨.٠٠"}, id="arabic-digits"),
        pytest.param({"total_amount": "9" * 5000}, id="5000-digits"),
        pytest.param({"refund_fee": "0.٠١"}, id="refund-arabic-digits"),
    ],
)
async def test_a_signed_alipay_notice_with_foreign_digits_is_a_bad_request(
    shop: Shop, redis: Redis, caplog: pytest.LogCaptureFixture, changes: dict[str, str]
) -> None:
    """Amounts are ASCII digits: int() would also read "9٨" as 98 and pay with it."""
    oid, delivery = await held_payment(shop, redis, "alipay")
    status, answer = await deliver(shop, signed_alipay_form(shop, delivery, **changes))
    assert (status, json.loads(answer)) == (400, {"error": "BAD_REQUEST"})
    assert await balance(shop) == 100
    assert await stored_status(redis, oid) == "created"
    assert not crashes(caplog)
    assert acknowledged("alipay", *await deliver(shop, delivery))
    assert await balance(shop) == 100 + 1060


async def test_an_alipay_form_that_is_not_utf_8_is_a_bad_request(
    shop: Shop, caplog: pytest.LogCaptureFixture
) -> None:
    """An encoded lone surrogate (CESU bytes) never becomes text: 400 BAD_REQUEST."""
    response = await shop.client.post(
        "/webhooks/alipay",
        data=b"out_trade_no=%ED%A0%80&notify_id=1&sign=AAAA",
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert (response.status, await response.json()) == (
        400,
        {"error": "BAD_REQUEST"},
    )
    assert not crashes(caplog)


async def test_a_signature_covers_the_header_bytes_as_sent(
    shop: Shop, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Signed over a timestamp with a non-UTF-8 byte: verified, then 400 BAD_REQUEST."""
    oid, _ = await held_payment(shop, redis, "wechatpay")
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    notice = shop.gateway.wechat_paid_notice(oid, trade)
    stamp = notice.headers["Wechatpay-Timestamp"].encode() + b"\xff"
    once = notice.headers["Wechatpay-Nonce"].encode()
    platform = signing.load_private_key(shop.gateway.keys.platform_private_pem)
    signature = signing.sign(platform, wechatpay.message(stamp, once, notice.body))
    fields = {
        **{k.encode(): v.encode() for k, v in notice.headers.items()},
        b"Wechatpay-Timestamp": stamp,
        b"Wechatpay-Signature": signature.encode(),
    }
    head = b"".join(name + b": " + value + b"\r\n" for name, value in fields.items())
    status, answer = await raw_post(
        shop.base_url, "/webhooks/wechatpay", head, notice.body
    )
    assert (status, json.loads(answer)) == (400, {"error": "BAD_REQUEST"})
    assert await balance(shop) == 100
    assert not crashes(caplog)
