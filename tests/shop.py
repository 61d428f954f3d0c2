"""Buying-credit tests: the real app, real settings, a fake provider on loopback.

The providers are played by the fake gateway app (service/payments/fake.py)
on a port of its own, with keys generated in the test; the service is
configured with real channel settings (STUDIO_PAYMENTS_*) that point at it,
exactly as production points at Alipay and WeChat Pay.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis

from service.app import create_app
from service.payments import signing
from service.payments.fake import FakeGateway, FakeKeys
from service.payments.fake_routes import fake_gateway_app

from .conftest import Client, SettingsFactory
from .payments import fake_keys
from .ports import free_port


def provider_environ(keys: FakeKeys, gateway_url: str) -> dict[str, str]:
    """The STUDIO_PAYMENTS_* variables of both channels, aimed at a fake gateway."""

    def public(private_pem: str) -> str:
        return signing.public_pem(signing.load_private_key(private_pem))

    return {
        "STUDIO_PAYMENTS_ALIPAY_APP_ID": keys.alipay_app_id,
        "STUDIO_PAYMENTS_ALIPAY_PRIVATE_KEY": keys.app_private_pem,
        "STUDIO_PAYMENTS_ALIPAY_PUBLIC_KEY": public(keys.alipay_private_pem),
        "STUDIO_PAYMENTS_ALIPAY_GATEWAY": f"{gateway_url}/fake-pay/alipay/gateway.do",
        "STUDIO_PAYMENTS_ALIPAY_SELLER_ID": keys.seller_id,
        "STUDIO_PAYMENTS_WECHATPAY_MCHID": keys.mchid,
        "STUDIO_PAYMENTS_WECHATPAY_APPID": keys.appid,
        "STUDIO_PAYMENTS_WECHATPAY_SERIAL": keys.serial,
        "STUDIO_PAYMENTS_WECHATPAY_PRIVATE_KEY": keys.merchant_private_pem,
        "STUDIO_PAYMENTS_WECHATPAY_APIV3_KEY": keys.apiv3_key,
        "STUDIO_PAYMENTS_WECHATPAY_PUBLIC_KEY": public(keys.platform_private_pem),
        "STUDIO_PAYMENTS_WECHATPAY_PUBLIC_KEY_ID": keys.public_key_id,
        "STUDIO_PAYMENTS_WECHATPAY_BASE_URL": f"{gateway_url}/fake-pay/wechatpay",
    }


@dataclass
class Shop:
    """The service under test, its fake provider, and the variables that join them."""

    client: Client
    base_url: str
    gateway: FakeGateway
    gateway_url: str
    environ: dict[str, str]
    browser: aiohttp.ClientSession
    # Set when the fake WeChat Pay receives a refund call.
    refund_asked: asyncio.Event
    # Clear it and the fake holds refund calls until it is set, as a slow
    # provider would; set (open) from the start.
    refunds_open: asyncio.Event


@contextlib.asynccontextmanager
async def open_shop(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    **variables: str,
) -> AsyncIterator[Shop]:
    """Start the fake gateway, then the real app on a known port aimed at it."""
    keys = fake_keys()
    refund_asked = asyncio.Event()
    refunds_open = asyncio.Event()
    refunds_open.set()

    @web.middleware
    async def hold_refunds(
        request: web.Request, handler: Handler
    ) -> web.StreamResponse:
        """Hold WeChat Pay refund calls while a test keeps them held.

        A held call is finished even if its caller hangs up meanwhile, as a
        real provider finishes a refund whose caller died.
        """
        if not request.path.endswith("/refund/domestic/refunds"):
            return await handler(request)
        await request.read()  # the whole call arrived before the caller can die
        refund_asked.set()

        async def held() -> web.StreamResponse:
            await refunds_open.wait()
            return await handler(request)

        return await asyncio.shield(asyncio.ensure_future(held()))

    async with aiohttp.ClientSession() as session, aiohttp.ClientSession() as browser:
        gateway = FakeGateway(keys, redis, session)
        gateway_app = fake_gateway_app(gateway)
        gateway_app.middlewares.append(hold_refunds)
        server = await aiohttp_server(gateway_app, host="127.0.0.1")
        gateway_url = str(server.make_url("")).rstrip("/")
        port = free_port()
        base_url = f"http://127.0.0.1:{port}"
        environ = {
            "STUDIO_BASE_URL": base_url,
            **provider_environ(keys, gateway_url),
            **variables,
        }
        app = create_app(make_settings(**environ))
        client = await aiohttp_client(
            app, server_kwargs={"host": "127.0.0.1", "port": port}
        )
        yield Shop(
            client,
            base_url,
            gateway,
            gateway_url,
            environ,
            browser,
            refund_asked,
            refunds_open,
        )


async def buy(
    client: Client,
    pack: str = "p98",
    channel: str = "alipay",
    device: str = "desktop",
    headers: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """Open an order through POST /api/orders; it must be created."""
    response = await client.post(
        "/api/orders",
        json={"pack": pack, "channel": channel, "device": device},
        headers=headers,
    )
    assert response.status == 201, await response.text()
    order: dict[str, Any] = await response.json()
    return order


async def checkout_page(shop: Shop, order: Mapping[str, Any]) -> str:
    """Follow the order's action as a browser does, to the fake's pay page."""
    action = order["action"]
    url = action["url"] if action["type"] == "redirect" else action["code_url"]
    async with shop.browser.get(url) as response:
        assert response.status == 200, await response.text()
        page = response.url
    return f"{page.scheme}://{page.raw_authority}{page.raw_path}"


async def pay(shop: Shop, order: Mapping[str, Any]) -> None:
    """Press "pay" on the fake's page: its notice reaches our webhook meanwhile."""
    page = await checkout_page(shop, order)
    async with shop.browser.post(f"{page}/pay", allow_redirects=False) as response:
        assert response.status == 303, await response.text()
        back = response.headers["Location"]
    if order["channel"] == "alipay":
        assert urlsplit(back).path == "/studio", back


async def get_order(client: Client, oid: str) -> dict[str, Any]:
    """Read one of my orders."""
    response = await client.get(f"/api/orders/{oid}")
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def credits(client: Client) -> dict[str, Any]:
    """Read /api/credits."""
    response = await client.get("/api/credits")
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body
