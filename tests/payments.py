"""Helpers for payment tests: keys made once, the fake gateway on a loopback port."""

from __future__ import annotations

import datetime
import functools
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer
from redis.asyncio import Redis

from service.payments.fake import FakeGateway, FakeKeys
from service.payments.fake_routes import fake_gateway_app
from service.payments.providers.alipay import AlipayProvider
from service.payments.providers.base import BadNotice, Checkout, Notice
from service.payments.providers.wechatpay import WechatPayProvider


@functools.cache
def fake_keys() -> FakeKeys:
    """One set of fake keys for the whole run (RSA key generation is slow)."""
    return FakeKeys.generate()


@functools.cache
def other_keys() -> FakeKeys:
    """A second, unrelated set: "the wrong key" in the tests."""
    return FakeKeys.generate()


# Where refund notices go (WeChat takes it per refund; the fake sends none there).
NOTIFY = "https://studio.example/webhooks/wechatpay"


def order_id() -> str:
    """A fresh order id shaped like ours (account id + 8 hex)."""
    return secrets.token_hex(16)


@dataclass
class Rig:
    """The fake providers on a port, our adapters aimed at them, our webhooks."""

    url: str
    gateway: FakeGateway
    alipay: AlipayProvider
    wechatpay: WechatPayProvider
    session: aiohttp.ClientSession
    notices: list[Notice] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def checkout(
        self, provider: str, oid: str, fen: int = 9800, device: str = "desktop"
    ) -> Checkout:
        """A checkout for an order, its notices sent to this rig's webhooks."""
        return Checkout(
            order_id=oid,
            fen=fen,
            subject="流光工坊 980 积分",
            device=device,
            client_ip="203.0.113.7",
            notify_url=f"{self.url}/webhooks/{provider}",
            return_url=f"{self.url}/studio?order={oid}#buy",
            expires_at=datetime.datetime.now(datetime.UTC)
            + datetime.timedelta(minutes=15),
        )


@asynccontextmanager
async def fake_rig(
    aiohttp_server: AiohttpServer, redis: Redis, keys: FakeKeys | None = None
) -> AsyncIterator[Rig]:
    """Start the fake gateway app (plus our webhooks) on loopback; aim adapters."""
    keys = keys or fake_keys()
    async with aiohttp.ClientSession() as session:
        gateway = FakeGateway(keys, redis, session)
        app = fake_gateway_app(gateway)
        holder: list[Rig] = []

        async def webhook(request: web.Request) -> web.StreamResponse:
            """Our side: verify with the real adapter, keep the notice."""
            rig = holder[0]
            provider = (
                rig.alipay if request.match_info["p"] == "alipay" else rig.wechatpay
            )
            try:
                notice = provider.verify_notice(
                    request.headers, await request.read(), time.time()
                )
            except BadNotice as refused:
                rig.refused.append(refused.code)
                return web.json_response({"error": refused.code}, status=400)
            rig.notices.append(notice)
            return provider.acknowledge()

        app.router.add_post("/webhooks/{p:alipay|wechatpay}", webhook)
        server = await aiohttp_server(app, host="127.0.0.1")
        url = str(server.make_url("")).rstrip("/")
        rig = Rig(
            url=url,
            gateway=gateway,
            alipay=AlipayProvider(keys.alipay_config(url), session),
            wechatpay=WechatPayProvider(keys.wechatpay_config(url), session),
            session=session,
        )
        holder.append(rig)
        yield rig


async def open_trade(rig: Rig, provider: str, oid: str, fen: int = 9800) -> None:
    """Create the order at the fake the way a buyer's browser would start it."""
    adapter = rig.alipay if provider == "alipay" else rig.wechatpay
    action = await adapter.create(rig.checkout(provider, oid, fen))
    if provider == "alipay":  # the browser follows the redirect to the gateway
        async with rig.session.get(action.url, allow_redirects=False) as response:
            assert response.status == 303, await response.text()


async def paid_trade(rig: Rig, provider: str, oid: str, fen: int = 9800) -> None:
    """Create and pay an order at the fake (its notice reaches the rig)."""
    await open_trade(rig, provider, oid, fen)
    delivery = await rig.gateway.pay(oid)
    assert delivery is not None
    assert delivery.status in (200, 204), delivery.answer
