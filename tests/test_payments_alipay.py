"""The Alipay adapter against the fake Alipay gateway, cross-checked with the SDK."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import aiohttp
import pytest
from alipay import AliPay
from hypothesis import given, settings, strategies as st
from pytest_aiohttp import AiohttpServer
from redis.asyncio import Redis

from service.payments import signing
from service.payments.fake import FakeGateway, FakeKeys
from service.payments.providers import alipay
from service.payments.providers.alipay import AlipayConfig, AlipayProvider
from service.payments.providers.base import BadNotice, ProviderError

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


def sdk(keys: FakeKeys, *, gateway: str = "") -> AliPay:
    """python-alipay-sdk as the merchant: our app key, the fake Alipay's public key."""
    client = AliPay(
        appid=keys.alipay_app_id,
        app_private_key_string=keys.app_private_pem,
        alipay_public_key_string=signing.public_pem(
            signing.load_private_key(keys.alipay_private_pem)
        ),
        sign_type="RSA2",
    )
    if gateway:
        client._gateway = gateway
    return client


def as_alipay(keys: FakeKeys) -> AliPay:
    """python-alipay-sdk holding the fake Alipay's key: it signs notices like Alipay."""
    return AliPay(
        appid=keys.alipay_app_id,
        app_private_key_string=keys.alipay_private_pem,
        alipay_public_key_string=signing.public_pem(
            signing.load_private_key(keys.app_private_pem)
        ),
    )


def query_of(url: str) -> dict[str, str]:
    return dict(parse_qsl(urlsplit(url).query, keep_blank_values=True))


async def trade(rig: Rig, oid: str) -> dict[str, str]:
    found = await rig.gateway.trade(oid)
    assert found is not None
    return found


async def notice_body(rig: Rig, oid: str, gateway: FakeGateway | None = None) -> bytes:
    """A paid notice for a paid trade, signed by the given (or the rig's) fake."""
    delivery = (gateway or rig.gateway).alipay_notice(oid, await trade(rig, oid))
    return delivery.body


def verify(rig: Rig, body: bytes) -> Any:
    return rig.alipay.verify_notice({}, body, time.time())


# -- create ---------------------------------------------------------------------


async def test_a_desktop_order_redirects_to_a_signed_page_pay_query(rig: Rig) -> None:
    oid = order_id()
    action = await rig.alipay.create(rig.checkout("alipay", oid, 29800))
    assert action.type == "redirect"
    assert action.as_json() == {"type": "redirect", "url": action.url}
    assert action.url.startswith(f"{rig.url}/fake-pay/alipay/gateway.do?")
    params = query_of(action.url)
    assert params["method"] == "alipay.trade.page.pay"
    assert params["sign_type"] == "RSA2"
    assert params["charset"] == "utf-8"
    assert params["notify_url"] == f"{rig.url}/webhooks/alipay"
    assert params["return_url"] == f"{rig.url}/studio?order={oid}#buy"
    biz = json.loads(params["biz_content"])
    assert biz["out_trade_no"] == oid
    assert biz["total_amount"] == "298.00"
    assert biz["product_code"] == "FAST_INSTANT_TRADE_PAY"
    assert biz["subject"] == "流光工坊 980 积分"
    assert len(biz["time_expire"]) == 19
    # The SDK checks our signature (sign_type included, as Alipay signs requests).
    client = as_alipay(fake_keys())
    assert client._verify(alipay.request_content(params), params["sign"])


async def test_a_mobile_order_is_a_wap_pay_with_a_quit_url(rig: Rig) -> None:
    oid = order_id()
    action = await rig.alipay.create(rig.checkout("alipay", oid, device="mobile"))
    params = query_of(action.url)
    biz = json.loads(params["biz_content"])
    assert params["method"] == "alipay.trade.wap.pay"
    assert biz["product_code"] == "QUICK_WAP_PAY"
    assert biz["quit_url"] == f"{rig.url}/studio?order={oid}#buy"


async def test_the_fake_gateway_accepts_the_sdks_page_pay_query(rig: Rig) -> None:
    oid = order_id()
    query = sdk(fake_keys()).api_alipay_trade_page_pay(
        subject="流光工坊 300 积分",
        out_trade_no=oid,
        total_amount="30.00",
        return_url=f"{rig.url}/studio",
        notify_url=f"{rig.url}/webhooks/alipay",
    )
    url = f"{rig.url}/fake-pay/alipay/gateway.do?{query}"
    async with rig.session.get(url, allow_redirects=False) as response:
        assert response.status == 303
        assert response.headers["Location"] == f"/fake-pay/alipay/checkout/{oid}"
    assert (await trade(rig, oid))["total"] == "3000"
    tampered = url.replace("30.00", "0.01")
    async with rig.session.get(tampered, allow_redirects=False) as response:
        assert response.status == 400


# -- query ------------------------------------------------------------------------


async def test_a_query_follows_the_trade_from_unknown_to_paid(rig: Rig) -> None:
    oid = order_id()
    assert await rig.alipay.query(oid) is None
    await open_trade(rig, "alipay", oid)
    waiting = await rig.alipay.query(oid)
    assert waiting is not None
    assert (waiting.paid, waiting.total_fen, waiting.trade_no) == (False, 9800, "")
    assert await rig.gateway.pay(oid) is not None
    paid = await rig.alipay.query(oid)
    assert paid is not None
    assert paid.paid
    assert paid.total_fen == 9800
    assert paid.refunded_fen == 0
    assert paid.trade_no == (await trade(rig, oid))["trade_no"]


async def test_the_sdk_queries_the_fake_and_verifies_its_signed_answer(
    rig: Rig,
) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    client = sdk(fake_keys(), gateway=f"{rig.url}/fake-pay/alipay/gateway.do")
    answer = await asyncio.to_thread(client.api_alipay_trade_query, out_trade_no=oid)
    assert answer["trade_status"] == "TRADE_SUCCESS"
    assert answer["total_amount"] == "98.00"


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=8),
        st.one_of(st.text(max_size=20), st.integers(), st.lists(st.text(max_size=5))),
        max_size=6,
    ),
    st.sampled_from([(",", ":"), (", ", ": ")]),
    st.booleans(),
)
def test_the_signed_text_is_the_raw_response_object_byte_for_byte(
    payload: dict[str, Any], separators: tuple[str, str], ascii_only: bool
) -> None:
    content = json.dumps(payload, separators=separators, ensure_ascii=ascii_only)
    raw = f'{{"alipay_trade_query_response"{separators[1]}{content},"sign":"x"}}'
    assert alipay.response_content(raw, "alipay_trade_query_response") == content


def test_a_response_without_the_object_has_no_signed_text() -> None:
    assert alipay.response_content('{"error_response":{}}', "x_response") is None
    assert alipay.response_content('{"x_response":{"a":', "x_response") is None


async def test_a_response_signed_with_another_key_is_refused(rig: Rig) -> None:
    config = dataclasses.replace(
        fake_keys().alipay_config(rig.url),
        alipay_public_key_pem=signing.public_pem(
            signing.load_private_key(other_keys().alipay_private_pem)
        ),
    )
    with pytest.raises(ProviderError) as refused:
        await AlipayProvider(config, rig.session).query(order_id())
    assert refused.value.code == "BAD_SIGNATURE"


async def test_the_gateway_refuses_a_request_signed_with_another_app_key(
    rig: Rig,
) -> None:
    config = dataclasses.replace(
        fake_keys().alipay_config(rig.url),
        private_key_pem=other_keys().app_private_pem,
    )
    with pytest.raises(ProviderError) as refused:
        await AlipayProvider(config, rig.session).query(order_id())
    assert (refused.value.code, refused.value.detail) == (
        "UNSIGNED",
        "isv.invalid-signature",
    )


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


async def test_a_gateway_that_is_down_is_a_provider_error(rig: Rig) -> None:
    config = fake_keys().alipay_config(f"http://127.0.0.1:{unused_port()}")
    provider = AlipayProvider(config, rig.session)
    with pytest.raises(ProviderError) as refused:
        await provider.query(order_id())
    assert refused.value.code == "UNREACHABLE"
    with pytest.raises(ProviderError):
        await provider.refund(order_id(), "r", 100, 9800, NOTIFY)


async def test_a_gateway_answering_garbage_is_a_provider_error(rig: Rig) -> None:
    wrong = dataclasses.replace(
        fake_keys().alipay_config(rig.url), gateway=f"{rig.url}/nowhere"
    )
    with pytest.raises(ProviderError) as refused:
        await AlipayProvider(wrong, rig.session).query(order_id())
    assert refused.value.code == "BAD_STATUS"


# -- refund -----------------------------------------------------------------------


async def test_a_refund_retried_with_the_same_id_refunds_once(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    first = await rig.alipay.refund(oid, f"{oid}-r1", 8360, 9800, NOTIFY)
    # the same request again: fund_change N, and the refund query says it succeeded
    again = await rig.alipay.refund(oid, f"{oid}-r1", 8360, 9800, NOTIFY)
    assert first == again == "done"
    assert await rig.gateway.refunds(oid) == {f"{oid}-r1": 8360}
    assert (await trade(rig, oid))["refunded"] == "8360"


async def test_a_refund_the_gateway_refuses_is_a_provider_error(rig: Rig) -> None:
    oid = order_id()
    with pytest.raises(ProviderError) as unknown:
        await rig.alipay.refund(oid, f"{oid}-r1", 100, 9800, NOTIFY)
    assert unknown.value.code == "ACQ.TRADE_NOT_EXIST"
    await open_trade(rig, "alipay", oid)
    with pytest.raises(ProviderError) as unpaid:
        await rig.alipay.refund(oid, f"{oid}-r1", 100, 9800, NOTIFY)
    assert unpaid.value.code == "ACQ.TRADE_STATUS_ERROR"
    assert await rig.gateway.pay(oid) is not None
    with pytest.raises(ProviderError) as too_much:
        await rig.alipay.refund(oid, f"{oid}-r1", 9801, 9800, NOTIFY)
    assert too_much.value.code == "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL"
    assert await rig.gateway.refunds(oid) == {}


# -- notices ----------------------------------------------------------------------


async def test_paying_sends_a_notice_our_verifier_and_the_sdk_accept(rig: Rig) -> None:
    oid = order_id()
    await open_trade(rig, "alipay", oid)
    delivery = await rig.gateway.pay(oid)
    assert delivery is not None
    assert (delivery.status, delivery.answer) == (200, b"success")
    [notice] = rig.notices
    assert (notice.provider, notice.order_id, notice.kind) == ("alipay", oid, "paid")
    assert (notice.total_fen, notice.refunded_fen) == (9800, 0)
    assert notice.trade_no == (await trade(rig, oid))["trade_no"]
    fields = dict(parse_qsl(delivery.body.decode()))
    assert notice.event_id == fields["notify_id"]
    sign = fields.pop("sign")
    assert sdk(fake_keys()).verify(fields, sign)
    assert await rig.gateway.pay(oid) is None  # paid once


async def test_a_notice_the_sdk_signed_as_alipay_is_accepted(rig: Rig) -> None:
    keys = fake_keys()
    fields = {
        "notify_id": "ac05099524730693a8b330c5ecf72da9786",
        "notify_type": "trade_status_sync",
        "app_id": keys.alipay_app_id,
        "seller_id": keys.seller_id,
        "out_trade_no": "a" * 32,
        "trade_no": "2013112011001004330000121536",
        "trade_status": "TRADE_FINISHED",
        "total_amount": "998.00",
        "subject": "流光工坊 9980 积分",
        "gmt_refund": "",
        "charset": "utf-8",
    }
    sign = as_alipay(keys)._sign(alipay.notice_content(fields))
    body = urlencode({**fields, "sign_type": "RSA2", "sign": sign}).encode()
    notice = verify(rig, body)
    assert (notice.kind, notice.total_fen, notice.order_id) == ("paid", 99800, "a" * 32)


async def test_a_tampered_notice_is_a_bad_signature(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    body = await notice_body(rig, oid)
    assert verify(rig, body).kind == "paid"
    for tampered in [
        body.replace(b"total_amount=98.00", b"total_amount=0.01"),
        body.replace(b"trade_status=TRADE_SUCCESS", b"trade_status=TRADE_FINISHED"),
        body + b"&extra=1",
        b"&".join(p for p in body.split(b"&") if not p.startswith(b"sign=")),
        body.replace(b"sign_type=RSA2", b"sign_type=RSA"),
    ]:
        with pytest.raises(BadNotice) as refused:
            verify(rig, tampered)
        assert refused.value.code == "BAD_SIGNATURE"


async def test_a_notice_signed_with_another_key_is_a_bad_signature(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    stranger = FakeGateway(other_keys(), rig.gateway.redis, rig.session)
    with pytest.raises(BadNotice) as refused:
        verify(rig, await notice_body(rig, oid, stranger))
    assert refused.value.code == "BAD_SIGNATURE"


@pytest.mark.parametrize("field", ["alipay_app_id", "seller_id"])
async def test_a_notice_for_another_app_or_seller_is_a_mismatch(
    rig: Rig, field: str
) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    keys = dataclasses.replace(fake_keys(), **{field: "2088999999999999"})
    elsewhere = FakeGateway(keys, rig.gateway.redis, rig.session)
    with pytest.raises(BadNotice) as refused:
        verify(rig, await notice_body(rig, oid, elsewhere))
    assert refused.value.code == "MISMATCH"


async def test_without_a_configured_seller_any_seller_is_accepted(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    config = dataclasses.replace(fake_keys().alipay_config(rig.url), seller_id="")
    keys = dataclasses.replace(fake_keys(), seller_id="2088999999999999")
    elsewhere = FakeGateway(keys, rig.gateway.redis, rig.session)
    body = await notice_body(rig, oid, elsewhere)
    notice = AlipayProvider(config, rig.session).verify_notice({}, body, time.time())
    assert notice.kind == "paid"


@pytest.fixture
async def offline() -> AsyncIterator[AlipayProvider]:
    """An adapter for checks that make no call."""
    async with aiohttp.ClientSession() as session:
        yield AlipayProvider(fake_keys().alipay_config("http://x"), session)


def signed_form(fields: dict[str, str]) -> bytes:
    key = signing.load_private_key(fake_keys().alipay_private_pem)
    sign = signing.sign(key, alipay.notice_content(fields).encode())
    return urlencode({**fields, "sign": sign, "sign_type": "RSA2"}).encode()


def base_fields(**changes: str) -> dict[str, str]:
    keys = fake_keys()
    fields = {
        "notify_id": "n1",
        "app_id": keys.alipay_app_id,
        "seller_id": keys.seller_id,
        "out_trade_no": "b" * 32,
        "trade_no": "2025",
        "trade_status": "TRADE_SUCCESS",
        "total_amount": "98.00",
    }
    return {k: v for k, v in (fields | changes).items() if v != "-"}


@pytest.mark.parametrize(
    ("changes", "kind", "refunded"),
    [
        ({}, "paid", 0),
        ({"trade_status": "TRADE_FINISHED"}, "paid", 0),
        ({"refund_fee": "30.00"}, "refund", 3000),
        ({"trade_status": "TRADE_CLOSED", "refund_fee": "98.00"}, "refund", 9800),
        ({"trade_status": "TRADE_CLOSED"}, "other", 0),
        ({"trade_status": "WAIT_BUYER_PAY"}, "other", 0),
        ({"refund_fee": "", "gmt_refund": ""}, "paid", 0),
    ],
)
async def test_a_notice_is_read_by_its_status_and_refund_fee(
    offline: AlipayProvider, changes: dict[str, str], kind: str, refunded: int
) -> None:
    provider = offline
    notice = provider.verify_notice({}, signed_form(base_fields(**changes)), 0)
    assert (notice.kind, notice.refunded_fen, notice.event_id) == (kind, refunded, "n1")


@pytest.mark.parametrize(
    "body",
    [
        signed_form(base_fields(notify_id="-")),
        signed_form(base_fields(out_trade_no="-")),
        signed_form(base_fields(total_amount="98.001")),
        signed_form(base_fields(total_amount="-1.00")),
        signed_form(base_fields(refund_fee="abc")),
        b"\xff\xfe",
        b"a=1&a=2",
    ],
)
async def test_a_malformed_notice_is_a_bad_request(
    offline: AlipayProvider, body: bytes
) -> None:
    provider = offline
    with pytest.raises(BadNotice) as refused:
        provider.verify_notice({}, body, 0)
    assert refused.value.code == "BAD_REQUEST"


async def test_console_refunds_send_cumulative_refund_notices(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "alipay", oid)
    partial = await rig.gateway.refund_from_console(oid, 3000)
    assert partial.status == 200
    full = await rig.gateway.refund_from_console(oid, 9800)
    assert full.status == 200
    assert [(n.kind, n.refunded_fen) for n in rig.notices] == [
        ("paid", 0),
        ("refund", 3000),
        ("refund", 9800),
    ]
    assert dict(parse_qsl(full.body.decode()))["trade_status"] == "TRADE_CLOSED"
    closed = await rig.alipay.query(oid)
    assert closed is not None
    assert not closed.paid  # Alipay shows a fully refunded trade as TRADE_CLOSED
    with pytest.raises(ValueError, match="nothing new"):
        await rig.gateway.refund_from_console(oid, 9800)


async def test_the_acknowledgement_is_the_bytes_success(
    offline: AlipayProvider,
) -> None:
    provider = offline
    answer = provider.acknowledge()
    assert (answer.status, answer.body, answer.content_type) == (
        200,
        b"success",
        "text/plain",
    )


def test_keys_never_show_in_the_configs_repr() -> None:
    config = fake_keys().alipay_config("http://x")
    assert "PRIVATE" not in repr(config)
    assert "PUBLIC" not in repr(config)
    assert config.app_id in repr(config)


@pytest.mark.parametrize(
    ("text", "fen"),
    [("98.00", 9800), ("0.01", 1), ("30", 3000), ("9.5", 950), ("0", 0)],
)
def test_amounts_read_as_fen(text: str, fen: int) -> None:
    assert alipay.fen_of(text) == fen
    assert alipay.fen_of(alipay.yuan(fen)) == fen


@pytest.mark.parametrize("text", ["", "1.234", "-1", "01.00", "1e3", " 1.00", "1."])
def test_non_amounts_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="amount"):
        alipay.fen_of(text)


def test_config_has_the_documented_fields() -> None:
    config = AlipayConfig("2021", "k", "p")
    assert config.gateway == "https://openapi.alipay.com/gateway.do"
    assert config.seller_id == ""
