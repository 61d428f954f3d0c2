"""The WeChat Pay adapter against the fake APIv3, cross-checked with wechatpayv3."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import secrets
import socket
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aiohttp
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pytest_aiohttp import AiohttpServer
from redis.asyncio import Redis
from wechatpayv3 import WeChatPay, WeChatPayType
from wechatpayv3.utils import rsa_sign, rsa_verify

from service.payments import signing
from service.payments.fake import Delivery, FakeGateway, FakeKeys
from service.payments.providers import wechatpay
from service.payments.providers.base import BadNotice, ProviderError
from service.payments.providers.wechatpay import WechatPayConfig, WechatPayProvider

from .payments import (
    NOTIFY,
    Rig,
    fake_keys,
    fake_rig,
    open_trade,
    order_id,
    other_keys,
    paid_trade,
)


@pytest.fixture
async def rig(aiohttp_server: AiohttpServer, redis: Redis) -> AsyncIterator[Rig]:
    async with fake_rig(aiohttp_server, redis) as started:
        yield started


def public(private_pem: str) -> str:
    return signing.public_pem(signing.load_private_key(private_pem))


def sdk(keys: FakeKeys, gateway: str = "") -> WeChatPay:
    """wechatpayv3 as the merchant, in public-key mode (no network at start)."""
    client = WeChatPay(
        wechatpay_type=WeChatPayType.NATIVE,
        mchid=keys.mchid,
        private_key=keys.merchant_private_pem,
        cert_serial_no=keys.serial,
        appid=keys.appid,
        apiv3_key=keys.apiv3_key,
        notify_url="https://studio.example/webhooks/wechatpay",
        public_key=public(keys.platform_private_pem),
        public_key_id=keys.public_key_id,
    )
    if gateway:
        client._core._gate_way = gateway
    return client


def verify(rig: Rig, delivery: Delivery, now: float | None = None) -> Any:
    return rig.wechatpay.verify_notice(
        delivery.headers, delivery.body, time.time() if now is None else now
    )


async def trade(rig: Rig, oid: str) -> dict[str, str]:
    found = await rig.gateway.trade(oid)
    assert found is not None
    return found


async def paid_delivery(rig: Rig, gateway: FakeGateway | None = None) -> Delivery:
    """A paid trade's TRANSACTION.SUCCESS, signed by the given (or the rig's) fake."""
    oid = order_id()
    await paid_trade(rig, "wechatpay", oid)
    return (gateway or rig.gateway).wechat_paid_notice(oid, await trade(rig, oid))


# -- requests -----------------------------------------------------------------------


async def test_our_authorization_is_what_the_sdk_would_sign(rig: Rig) -> None:
    path = "/v3/pay/transactions/out-trade-no/abc?mchid=1900000001"
    body = '{"a":"流光"}'
    header = rig.wechatpay.authorization("POST", path, body)
    assert header.startswith("WECHATPAY2-SHA256-RSA2048 mchid=")
    fields = wechatpay.authorization_fields(header)
    assert set(fields) == {"mchid", "nonce_str", "signature", "timestamp", "serial_no"}
    assert fields["serial_no"] == fake_keys().serial
    assert abs(int(fields["timestamp"]) - time.time()) < 5
    # The SDK checks "ts\nnonce\nbody\n"; ours is "METHOD\npath\nts\nnonce\nbody\n".
    merchant = signing.load_private_key(fake_keys().merchant_private_pem).public_key()
    signed_head = f"POST\n{path}\n{fields['timestamp']}"
    assert rsa_verify(
        signed_head, fields["nonce_str"], body, fields["signature"], merchant
    )
    assert not rsa_verify(
        signed_head, fields["nonce_str"], body + " ", fields["signature"], merchant
    )


def test_an_authorization_header_is_read_back() -> None:
    assert wechatpay.authorization_fields('WECHATPAY2-SHA256-RSA2048 a="1",b="2"') == {
        "a": "1",
        "b": "2",
    }
    assert wechatpay.authorization_fields('Bearer a="1"') == {}
    assert wechatpay.authorization_fields("WECHATPAY2-SHA256-RSA2048 a=1") == {}


async def test_a_desktop_order_is_a_native_qr_code(rig: Rig) -> None:
    oid = order_id()
    action = await rig.wechatpay.create(rig.checkout("wechatpay", oid, 3000))
    assert action.type == "qrcode"
    assert action.as_json() == {"type": "qrcode", "code_url": action.url}
    assert action.url == f"{rig.url}/fake-pay/wechatpay/checkout/{oid}"
    recorded = await trade(rig, oid)
    assert (recorded["total"], recorded["status"]) == ("3000", "created")
    assert recorded["notify_url"] == f"{rig.url}/webhooks/wechatpay"


async def test_a_mobile_order_redirects_to_h5_with_our_return_url(rig: Rig) -> None:
    oid = order_id()
    action = await rig.wechatpay.create(rig.checkout("wechatpay", oid, device="mobile"))
    assert action.type == "redirect"
    parts = urlsplit(action.url)
    assert parts.path == f"/fake-pay/wechatpay/checkout/{oid}"
    query = dict(parse_qsl(parts.query))
    assert query["prepay_id"].startswith("wx")
    assert query["redirect_url"] == f"{rig.url}/studio?order={oid}#buy"


async def test_the_sdk_creates_and_queries_against_the_fake(rig: Rig) -> None:
    """The fake checks the SDK's request signatures; the SDK checks the fake's."""
    client = sdk(fake_keys(), f"{rig.url}/fake-pay/wechatpay")
    oid = order_id()
    status, text = await asyncio.to_thread(
        client.pay, description="流光工坊", out_trade_no=oid, amount={"total": 9800}
    )
    assert status == 200, text
    assert json.loads(text)["code_url"].endswith(f"/checkout/{oid}")
    assert await rig.gateway.pay(oid) is not None
    status, text = await asyncio.to_thread(client.query, out_trade_no=oid)
    assert status == 200
    assert json.loads(text)["trade_state"] == "SUCCESS"


async def test_the_fake_refuses_a_request_signed_with_another_key(rig: Rig) -> None:
    config = dataclasses.replace(
        fake_keys().wechatpay_config(rig.url),
        private_key_pem=other_keys().merchant_private_pem,
    )
    with pytest.raises(ProviderError) as refused:
        await WechatPayProvider(config, rig.session).query(order_id())
    assert refused.value.code == "SIGN_ERROR"


async def test_a_response_signed_with_another_key_is_refused(rig: Rig) -> None:
    config = dataclasses.replace(
        fake_keys().wechatpay_config(rig.url),
        public_key_pem=public(other_keys().platform_private_pem),
    )
    oid = order_id()
    await open_trade(rig, "wechatpay", oid)
    with pytest.raises(ProviderError) as refused:
        await WechatPayProvider(config, rig.session).query(oid)
    assert refused.value.code == "BAD_SIGNATURE"


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_gateway_that_is_down_is_a_provider_error(rig: Rig) -> None:
    config = fake_keys().wechatpay_config(f"http://127.0.0.1:{unused_port()}")
    provider = WechatPayProvider(config, rig.session)
    for call in (
        provider.query(order_id()),
        provider.refund(order_id(), "r1", 1, 100, NOTIFY),
        provider.create(rig.checkout("wechatpay", order_id())),
    ):
        with pytest.raises(ProviderError) as refused:
            await call
        assert refused.value.code == "UNREACHABLE"


async def test_a_gateway_answering_garbage_is_a_provider_error(rig: Rig) -> None:
    config = dataclasses.replace(
        fake_keys().wechatpay_config(rig.url), base_url=f"{rig.url}/nowhere"
    )
    with pytest.raises(ProviderError) as refused:
        await WechatPayProvider(config, rig.session).query(order_id())
    assert refused.value.code == "BAD_RESPONSE"


# -- query and refund ---------------------------------------------------------------


async def test_a_query_follows_the_trade_from_unknown_to_refunded(rig: Rig) -> None:
    oid = order_id()
    assert await rig.wechatpay.query(oid) is None
    await open_trade(rig, "wechatpay", oid)
    waiting = await rig.wechatpay.query(oid)
    assert waiting is not None
    assert (waiting.paid, waiting.trade_no, waiting.total_fen) == (False, "", 9800)
    assert await rig.gateway.pay(oid) is not None
    paid = await rig.wechatpay.query(oid)
    assert paid is not None
    assert (paid.paid, paid.total_fen) == (True, 9800)
    assert paid.trade_no == (await trade(rig, oid))["trade_no"]
    await rig.wechatpay.refund(oid, f"{oid}-r1", 100, 9800, NOTIFY)
    refunded = await rig.wechatpay.query(oid)
    assert refunded is not None
    assert (refunded.paid, refunded.refunded_fen) == (True, 0)  # trade_state REFUND


async def test_a_refund_retried_with_the_same_id_refunds_once(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "wechatpay", oid)
    first = await rig.wechatpay.refund(oid, f"{oid}-r1", 8360, 9800, NOTIFY)
    again = await rig.wechatpay.refund(oid, f"{oid}-r1", 8360, 9800, NOTIFY)
    assert first == again == "done"
    assert await rig.gateway.refunds(oid) == {f"{oid}-r1": 8360}
    assert (await trade(rig, oid))["refunded"] == "8360"


async def test_a_refund_still_processing_is_not_done_until_it_says_success(
    rig: Rig,
) -> None:
    """WeChat may answer PROCESSING: taken, the money not moved yet; the same
    refund asked again answers SUCCESS once it has. The request names notify_url."""
    oid = order_id()
    await paid_trade(rig, "wechatpay", oid)
    rig.gateway.refund_status = "PROCESSING"
    assert await rig.wechatpay.refund(oid, f"{oid}-r1", 500, 9800, NOTIFY) == (
        "processing"
    )
    assert await rig.wechatpay.refund(oid, f"{oid}-r1", 500, 9800, NOTIFY) == "done"
    assert await rig.gateway.refunds(oid) == {f"{oid}-r1": 500}


async def test_a_refund_the_gateway_refuses_is_a_provider_error(rig: Rig) -> None:
    oid = order_id()
    with pytest.raises(ProviderError) as unknown:
        await rig.wechatpay.refund(oid, f"{oid}-r1", 100, 9800, NOTIFY)
    assert unknown.value.code == "RESOURCE_NOT_EXISTS"
    await open_trade(rig, "wechatpay", oid)
    with pytest.raises(ProviderError) as unpaid:
        await rig.wechatpay.refund(oid, f"{oid}-r1", 100, 9800, NOTIFY)
    assert unpaid.value.code == "INVALID_REQUEST"
    assert await rig.gateway.pay(oid) is not None
    with pytest.raises(ProviderError) as wrong_total:
        await rig.wechatpay.refund(oid, f"{oid}-r1", 100, 9900, NOTIFY)
    assert wrong_total.value.code == "PARAM_ERROR"
    with pytest.raises(ProviderError) as too_much:
        await rig.wechatpay.refund(oid, f"{oid}-r1", 9801, 9800, NOTIFY)
    assert too_much.value.code == "NOT_ENOUGH"
    assert await rig.gateway.refunds(oid) == {}


# -- callbacks ----------------------------------------------------------------------


async def test_paying_sends_a_callback_our_verifier_and_the_sdk_accept(
    rig: Rig,
) -> None:
    oid = order_id()
    await open_trade(rig, "wechatpay", oid)
    delivery = await rig.gateway.pay(oid)
    assert delivery is not None
    assert (delivery.status, delivery.answer) == (204, b"")
    [notice] = rig.notices
    assert (notice.provider, notice.order_id, notice.kind) == ("wechatpay", oid, "paid")
    assert (notice.total_fen, notice.refunded_fen, notice.refund_id) == (9800, 0, "")
    assert notice.event_id == json.loads(delivery.body)["id"]
    assert notice.event_id.startswith("EV-")
    checked = sdk(fake_keys()).callback(dict(delivery.headers), delivery.body)
    assert checked is not None
    assert checked["resource"]["trade_state"] == "SUCCESS"
    assert checked["resource"]["out_trade_no"] == oid


def sdk_signed_callback(
    keys: FakeKeys, event_type: str, resource: Mapping[str, Any]
) -> tuple[dict[str, str], bytes]:
    """A callback made with wechatpayv3's signer and cryptography's AES-GCM directly."""
    once = secrets.token_hex(6)
    sealed = AESGCM(keys.apiv3_key.encode()).encrypt(
        once.encode(), json.dumps(resource).encode(), b""
    )
    body = json.dumps(
        {
            "id": "EV-2018022511223320873",
            "create_time": "2015-05-20T13:29:35+08:00",
            "resource_type": "encrypt-resource",
            "event_type": event_type,
            "summary": "支付成功",
            "resource": {
                "original_type": "transaction",
                "algorithm": "AEAD_AES_256_GCM",
                "ciphertext": base64.b64encode(sealed).decode(),
                "associated_data": "",
                "nonce": once,
            },
        }
    )
    stamp, nonce = str(int(time.time())), "5K8264ILTKCH16CQ2502SI8ZNMTM67VS"
    platform = signing.load_private_key(keys.platform_private_pem)
    headers = {
        "wechatpay-timestamp": stamp,
        "wechatpay-nonce": nonce,
        "wechatpay-signature": rsa_sign(platform, f"{stamp}\n{nonce}\n{body}\n"),
        "wechatpay-serial": keys.public_key_id,
    }
    return headers, body.encode()


async def test_a_callback_signed_by_the_sdk_is_accepted(rig: Rig) -> None:
    keys = fake_keys()
    resource = {
        "mchid": keys.mchid,
        "appid": keys.appid,
        "out_trade_no": "c" * 32,
        "transaction_id": "4200000000000000000000000001",
        "trade_state": "SUCCESS",
        "amount": {"total": 29800, "payer_total": 29800, "currency": "CNY"},
    }
    headers, body = sdk_signed_callback(keys, "TRANSACTION.SUCCESS", resource)
    notice = rig.wechatpay.verify_notice(headers, body, time.time())
    assert (notice.kind, notice.order_id, notice.total_fen) == ("paid", "c" * 32, 29800)
    assert notice.event_id == "EV-2018022511223320873"


async def test_a_tampered_callback_is_a_bad_signature(rig: Rig) -> None:
    delivery = await paid_delivery(rig)
    assert verify(rig, delivery).kind == "paid"
    headers = dict(delivery.headers)
    cases: list[tuple[dict[str, str], bytes]] = [
        (headers, delivery.body.replace(b'"TRANSACTION.SUCCESS"', b'"REFUND.SUCCESS"')),
        (headers, delivery.body + b" "),
        (headers | {"Wechatpay-Serial": "PUB_KEY_ID_OTHER"}, delivery.body),
        (
            headers | {"Wechatpay-Signature-Type": "WECHATPAY2-SM2-WITH-SM3"},
            delivery.body,
        ),
        (headers | {"Wechatpay-Timestamp": str(int(time.time()) + 1)}, delivery.body),
        (
            {k: v for k, v in headers.items() if k != "Wechatpay-Signature"},
            delivery.body,
        ),
    ]
    for tampered_headers, body in cases:
        with pytest.raises(BadNotice) as refused:
            rig.wechatpay.verify_notice(tampered_headers, body, time.time())
        assert refused.value.code == "BAD_SIGNATURE"


async def test_a_callback_signed_with_another_key_is_a_bad_signature(rig: Rig) -> None:
    keys = dataclasses.replace(
        fake_keys(), platform_private_pem=other_keys().platform_private_pem
    )
    stranger = FakeGateway(keys, rig.gateway.redis, rig.session)
    with pytest.raises(BadNotice) as refused:
        verify(rig, await paid_delivery(rig, stranger))
    assert refused.value.code == "BAD_SIGNATURE"


async def test_a_callback_sealed_with_another_apiv3_key_is_refused(rig: Rig) -> None:
    keys = dataclasses.replace(fake_keys(), apiv3_key=other_keys().apiv3_key)
    stranger = FakeGateway(keys, rig.gateway.redis, rig.session)
    with pytest.raises(BadNotice) as refused:
        verify(rig, await paid_delivery(rig, stranger))
    assert refused.value.code == "BAD_SIGNATURE"


@pytest.mark.parametrize("field", ["mchid", "appid"])
async def test_a_callback_for_another_merchant_or_app_is_a_mismatch(
    rig: Rig, field: str
) -> None:
    keys = dataclasses.replace(fake_keys(), **{field: "1999999999"})
    elsewhere = FakeGateway(keys, rig.gateway.redis, rig.session)
    with pytest.raises(BadNotice) as refused:
        verify(rig, await paid_delivery(rig, elsewhere))
    assert refused.value.code == "MISMATCH"


async def test_a_transaction_callback_naming_no_app_is_a_mismatch(rig: Rig) -> None:
    """CONTRACT §8: appid must match; a transaction's cannot be left out."""
    resource = {
        "mchid": fake_keys().mchid, "out_trade_no": order_id(),
        "transaction_id": "4200" + "0" * 24, "trade_state": "SUCCESS",
        "amount": {"total": 9800, "payer_total": 9800, "currency": "CNY"},
    }  # fmt: skip
    delivery = rig.gateway.wechat_notice(
        "http://x", "TRANSACTION.SUCCESS", "transaction", resource
    )
    with pytest.raises(BadNotice) as refused:
        verify(rig, delivery)
    assert refused.value.code == "MISMATCH"


async def test_a_callback_five_minutes_off_is_stale(rig: Rig) -> None:
    delivery = await paid_delivery(rig)
    stamp = int(delivery.headers["Wechatpay-Timestamp"])
    assert verify(rig, delivery, now=stamp + 299).kind == "paid"
    assert verify(rig, delivery, now=stamp - 299).kind == "paid"
    for now in (stamp + 300, stamp - 300, stamp + 3600):
        with pytest.raises(BadNotice) as refused:
            verify(rig, delivery, now=now)
        assert refused.value.code == "STALE"


async def test_a_signed_callback_that_is_not_an_encrypted_event_is_a_bad_request(
    rig: Rig,
) -> None:
    for body in [b"[]", b"not json", b'{"resource_type":"plain"}', b'{"id":"EV-1"}']:
        headers = rig.gateway.wechat_headers(body)
        with pytest.raises(BadNotice) as refused:
            rig.wechatpay.verify_notice(headers, body, time.time())
        assert refused.value.code == "BAD_REQUEST"


async def test_console_refunds_send_one_notice_per_refund(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "wechatpay", oid)
    first = await rig.gateway.refund_from_console(oid, 3000)
    second = await rig.gateway.refund_from_console(oid, 9800)
    assert (first.status, second.status) == (204, 204)
    paid, one, two = rig.notices
    assert paid.kind == "paid"
    assert (one.kind, one.refunded_fen, two.kind, two.refunded_fen) == (
        "refund",
        3000,
        "refund",
        6800,
    )
    assert one.refund_id != two.refund_id
    assert await rig.gateway.refunds(oid) == {one.refund_id: 3000, two.refund_id: 6800}
    checked = sdk(fake_keys()).callback(dict(second.headers), second.body)
    assert checked is not None
    assert checked["resource"]["amount"]["refund"] == 6800


def offline_provider(session: aiohttp.ClientSession) -> WechatPayProvider:
    return WechatPayProvider(fake_keys().wechatpay_config("http://x"), session)


@pytest.mark.parametrize(
    ("event_type", "resource", "kind"),
    [
        ("TRANSACTION.SUCCESS", {"trade_state": "NOTPAY"}, "other"),
        # the money did not move: nothing to take, a person to tell
        (
            "REFUND.ABNORMAL",
            {"refund_status": "ABNORMAL", "out_refund_no": "r"},
            "refund_failed",
        ),
        (
            "REFUND.CLOSED",
            {"refund_status": "CLOSED", "out_refund_no": "r"},
            "refund_failed",
        ),
    ],
)
async def test_other_events_are_read_as_nothing_to_take(
    redis: Redis, event_type: str, resource: dict[str, str], kind: str
) -> None:
    async with aiohttp.ClientSession() as session:
        gateway = FakeGateway(fake_keys(), redis, session)
        full = {
            "mchid": fake_keys().mchid,
            "out_trade_no": "d" * 32,
            "amount": {"total": 100, "refund": 100},
            **resource,
        }
        delivery = gateway.wechat_notice("http://x", event_type, "refund", full)
        notice = offline_provider(session).verify_notice(
            delivery.headers, delivery.body, time.time()
        )
    assert (notice.kind, notice.refunded_fen) == (kind, 0)


async def test_the_acknowledgement_is_204_without_a_body() -> None:
    async with aiohttp.ClientSession() as session:
        answer = offline_provider(session).acknowledge()
    assert (answer.status, answer.body) == (204, None)


def test_keys_never_show_in_the_configs_repr() -> None:
    config = fake_keys().wechatpay_config("http://x")
    text = repr(config)
    assert "PRIVATE" not in text
    assert "PUBLIC KEY-----" not in text
    assert fake_keys().apiv3_key not in text
    assert config.mchid in text


def test_config_has_the_documented_fields() -> None:
    config = WechatPayConfig("m", "a", "s", "k", "v3", "p", "PUB_KEY_ID_1")
    assert config.base_url == "https://api.mch.weixin.qq.com"


def test_times_are_written_in_beijing_time() -> None:
    import datetime

    moment = datetime.datetime(2025, 1, 2, 7, 4, 5, tzinfo=datetime.UTC)
    assert wechatpay.rfc3339(moment) == "2025-01-02T15:04:05+08:00"
