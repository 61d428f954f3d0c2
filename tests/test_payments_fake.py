"""The fake provider: shared keys, the buyer's page, notices and console refunds."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import AsyncIterator
from urllib.parse import quote

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer
from redis.asyncio import Redis

from service.payments.fake import KEYS_KEY, FakeGateway, FakeKeys, trade_key
from service.payments.providers.base import ProviderError

from .payments import (
    NOTIFY,
    Rig,
    fake_keys,
    fake_rig,
    open_trade,
    order_id,
    paid_trade,
)


@pytest.fixture
async def rig(aiohttp_server: AiohttpServer, redis: Redis) -> AsyncIterator[Rig]:
    async with fake_rig(aiohttp_server, redis) as started:
        yield started


def test_keys_survive_json_and_stay_out_of_reprs() -> None:
    keys = fake_keys()
    assert FakeKeys.from_json(keys.to_json()) == keys
    assert "PRIVATE" not in repr(keys)
    assert keys.apiv3_key not in repr(keys)
    assert len(keys.apiv3_key) == 32


async def test_every_process_gets_the_same_keys_through_redis(redis: Redis) -> None:
    first, second = await asyncio.gather(FakeKeys.shared(redis), FakeKeys.shared(redis))
    assert first == second
    assert await FakeKeys.shared(redis) == first
    stored = await redis.get(KEYS_KEY)
    assert stored is not None
    assert FakeKeys.from_json(stored) == first


def test_the_configs_point_at_the_fake_routes() -> None:
    keys = fake_keys()
    assert keys.alipay_config("https://studio.example/").gateway == (
        "https://studio.example/fake-pay/alipay/gateway.do"
    )
    assert keys.wechatpay_config("https://studio.example").base_url == (
        "https://studio.example/fake-pay/wechatpay"
    )


async def page(rig: Rig, path: str) -> tuple[int, str]:
    async with rig.session.get(f"{rig.url}{path}", allow_redirects=False) as response:
        return response.status, await response.text()


async def press(
    rig: Rig, path: str, button: str, form: dict[str, str] | None = None
) -> tuple[int, str]:
    """Submit one of the page's forms; return the status and where it leads."""
    async with rig.session.post(
        f"{rig.url}{path}/{button}", data=form or {}, allow_redirects=False
    ) as response:
        return response.status, response.headers.get("Location", "")


@pytest.mark.parametrize("provider", ["alipay", "wechatpay"])
async def test_the_page_shows_the_amount_and_two_forms_without_scripts(
    rig: Rig, provider: str
) -> None:
    oid = order_id()
    await open_trade(rig, provider, oid, 29800)
    status, text = await page(rig, f"/fake-pay/{provider}/checkout/{oid}")
    assert status == 200
    assert "¥298.00" in text
    assert oid in text
    assert "流光工坊 980 积分" in text
    assert len(re.findall(r'<form method="post"', text)) == 2
    assert "支付 Pay" in text
    assert "取消 Cancel" in text
    assert "<script" not in text
    assert "style" not in text
    assert " on" not in re.sub(r">[^<]*<", "><", text)  # no event handler attributes


async def test_paying_on_the_alipay_page_notifies_and_returns_the_buyer(
    rig: Rig,
) -> None:
    oid = order_id()
    action = await rig.alipay.create(rig.checkout("alipay", oid))
    async with rig.session.get(action.url) as response:  # follows the 303
        assert response.status == 200
        assert str(response.url).endswith(f"/fake-pay/alipay/checkout/{oid}")
    path = f"/fake-pay/alipay/checkout/{oid}"
    assert await press(rig, path, "pay") == (303, f"{rig.url}/studio?order={oid}#buy")
    assert [(n.order_id, n.kind) for n in rig.notices] == [(oid, "paid")]
    status, text = await page(rig, path)
    assert status == 200
    assert "已支付 Paid" in text
    assert "<form" not in text
    # A second press (the back button) pays nothing more and sends nothing.
    assert (await press(rig, path, "pay"))[0] == 303
    assert len(rig.notices) == 1


async def test_cancel_returns_the_buyer_without_paying(rig: Rig) -> None:
    oid = order_id()
    await open_trade(rig, "alipay", oid)
    path = f"/fake-pay/alipay/checkout/{oid}"
    assert await press(rig, path, "cancel") == (
        303,
        f"{rig.url}/studio?order={oid}#buy",
    )
    assert rig.notices == []
    assert (await rig.gateway.trade(oid) or {})["status"] == "created"


@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"x"),  # no boundary
        ("multipart/form-data; boundary=x", b"--x\r\n"),  # a part without a name
        ("application/x-www-form-urlencoded; charset=utf-8", b"a=\xff"),
        ("application/x-www-form-urlencoded; charset=bogus", b"a=b"),
    ],
)
async def test_a_form_that_cannot_be_read_is_400_and_pays_nothing(
    rig: Rig, content_type: str, body: bytes
) -> None:
    """The pay button reads its form first: nothing is paid on a bad one."""
    oid = order_id()
    await rig.wechatpay.create(rig.checkout("wechatpay", oid, device="mobile"))
    pay = f"/fake-pay/wechatpay/checkout/{oid}/pay"
    for path in (pay, "/fake-pay/alipay/gateway.do"):
        async with rig.session.post(
            f"{rig.url}{path}", data=body, headers={"Content-Type": content_type}
        ) as response:
            assert response.status == 400, path
    assert rig.notices == []
    assert (await rig.gateway.trade(oid) or {})["status"] == "created"


async def test_a_wechat_h5_page_returns_only_to_the_merchants_origin(rig: Rig) -> None:
    oid = order_id()
    action = await rig.wechatpay.create(rig.checkout("wechatpay", oid, device="mobile"))
    status, text = await page(rig, action.url.removeprefix(rig.url))
    assert status == 200
    ours = f"{rig.url}/studio?order={oid}#buy"
    assert f'name="redirect_url" value="{ours}"' in text
    path = f"/fake-pay/wechatpay/checkout/{oid}"
    evil = {"redirect_url": "https://evil.example/phish"}
    assert await press(rig, path, "cancel", evil) == (200, "")
    assert await press(rig, path, "cancel", {"redirect_url": ours}) == (303, ours)
    assert await press(rig, path, "pay", evil) == (303, path)
    assert [n.kind for n in rig.notices] == ["paid"]


async def test_a_wechat_native_page_shows_paid_after_paying(rig: Rig) -> None:
    oid = order_id()
    action = await rig.wechatpay.create(rig.checkout("wechatpay", oid))
    path = action.url.removeprefix(rig.url)
    assert await press(rig, path, "pay") == (303, path)
    assert "已支付 Paid" in (await page(rig, path))[1]
    assert [(n.provider, n.kind) for n in rig.notices] == [("wechatpay", "paid")]


@pytest.mark.parametrize(
    "path",
    [
        "/fake-pay/alipay/checkout/0123456789abcdef0123456789abcdef",
        "/fake-pay/paypal/checkout/0123456789abcdef0123456789abcdef",
        "/fake-pay/alipay/checkout/<script>",
    ],
)
async def test_a_page_for_no_trade_is_not_found(rig: Rig, path: str) -> None:
    assert (await page(rig, quote(path)))[0] == 404


async def test_a_trade_of_one_provider_has_no_page_at_the_other(rig: Rig) -> None:
    oid = order_id()
    await open_trade(rig, "wechatpay", oid)
    assert (await page(rig, f"/fake-pay/alipay/checkout/{oid}"))[0] == 404
    assert await rig.alipay.query(oid) is None


async def test_a_webhook_that_is_down_leaves_the_trade_paid(redis: Redis) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}/webhooks/alipay"
    async with aiohttp.ClientSession() as session:
        gateway = FakeGateway(fake_keys(), redis, session)
        oid = order_id()
        await gateway.record(oid, "alipay", 9800, "s", dead, "http://x/studio")
        delivery = await gateway.pay(oid)
    assert delivery is not None
    assert delivery.status == 0
    assert (await gateway.trade(oid) or {})["status"] == "paid"


async def test_a_trade_is_recorded_once_and_expires(rig: Rig) -> None:
    oid = order_id()
    await rig.gateway.record(oid, "alipay", 9800, "first", "http://a/webhooks/alipay")
    await rig.gateway.record(oid, "alipay", 100, "second", "http://b/webhooks/alipay")
    trade = await rig.gateway.trade(oid)
    assert trade is not None
    assert (trade["total"], trade["subject"]) == ("9800", "first")
    ttl = await rig.gateway.redis.ttl(trade_key(oid))
    assert 0 < ttl <= 7 * 86400


async def test_console_refunds_need_a_paid_trade_and_something_new(rig: Rig) -> None:
    oid = order_id()
    with pytest.raises(ValueError, match="no paid trade"):
        await rig.gateway.refund_from_console(oid, 100)
    await paid_trade(rig, "alipay", oid)
    with pytest.raises(ValueError, match="refused"):
        await rig.gateway.refund_from_console(oid, 9801)
    await rig.alipay.refund(oid, f"{oid}-r1", 1000, 9800, NOTIFY)
    with pytest.raises(ValueError, match="nothing new"):
        await rig.gateway.refund_from_console(oid, 1000)
    delivery = await rig.gateway.refund_from_console(oid, 1500)
    assert delivery.status == 200
    assert [(n.kind, n.refunded_fen) for n in rig.notices][-1] == ("refund", 1500)
    assert sum((await rig.gateway.refunds(oid)).values()) == 1500


async def test_concurrent_refunds_with_one_id_refund_once(rig: Rig) -> None:
    oid = order_id()
    await paid_trade(rig, "wechatpay", oid)
    await asyncio.gather(
        *(rig.wechatpay.refund(oid, f"{oid}-r1", 4900, 9800, NOTIFY) for _ in range(5))
    )
    assert await rig.gateway.refunds(oid) == {f"{oid}-r1": 4900}


async def test_malformed_signed_requests_get_the_providers_errors(rig: Rig) -> None:
    oid = order_id()
    params = rig.alipay.signed(
        "alipay.trade.page.pay", {"out_trade_no": oid, "total_amount": "9.999"}
    )
    gateway = f"{rig.url}/fake-pay/alipay/gateway.do"
    async with rig.session.get(gateway, params=params) as response:
        assert response.status == 400
    with pytest.raises(ProviderError) as unknown_method:
        await rig.alipay.call("alipay.trade.cancel", {"out_trade_no": oid})
    assert unknown_method.value.code == "UNSIGNED"
    assert await rig.alipay.call("alipay.trade.refund", {"out_trade_no": oid}) == {
        "code": "40004",
        "msg": "Business Failed",
        "sub_code": "ACQ.INVALID_PARAMETER",
        "sub_msg": "ACQ.INVALID_PARAMETER",
    }
    no_scene = {
        "appid": fake_keys().appid,
        "mchid": fake_keys().mchid,
        "description": "x",
        "out_trade_no": oid,
        "notify_url": f"{rig.url}/webhooks/wechatpay",
        "amount": {"total": 100},
    }
    for path, payload in [
        ("/v3/pay/transactions/h5", no_scene),
        ("/v3/pay/transactions/native", None),
        ("/v3/pay/transactions/native", {"amount": "x"}),
        ("/v3/refund/domestic/refunds", {"out_trade_no": oid}),
    ]:
        status, answer = await rig.wechatpay.call("POST", path, payload)
        assert (status, answer["code"]) == (400, "PARAM_ERROR")
    assert await rig.gateway.trade(oid) is None
