"""Payments' resources for the life of a process: the providers and the orders."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Final

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from ..keys import REDIS, SETTINGS
from ..settings import PaymentsSettings, Settings
from ..store.connect import STORE_ERRORS
from ..studio.context import EMBEDDED_WORKER
from .keys import ORDERS, PROVIDERS
from .orders import OrderStore
from .providers.base import Provider
from .reconciler import Reconciler

if TYPE_CHECKING:
    from .fake import FakeGateway

_LOGGER: Final = logging.getLogger(__name__)
# Every provider call ends within this (the adapters set it per call too).
PROVIDER_TIMEOUT: Final = aiohttp.ClientTimeout(total=10)


def order_store(settings: Settings, redis: Redis) -> OrderStore:
    """Build the order store the settings describe."""
    return OrderStore(
        redis,
        order_minutes=settings.payments.order_minutes,
        expire_months=settings.workbench.expire_months,
        wait_replicas=settings.redis_wait_replicas,
    )


def real_providers(
    settings: PaymentsSettings, session: aiohttp.ClientSession
) -> dict[str, Provider]:
    """Build the adapters of the channels whose settings are complete."""
    providers: dict[str, Provider] = {}
    # Each channel's adapter (and its cryptography) is loaded only when set.
    if (alipay := settings.alipay) is not None:
        from .providers.alipay import AlipayConfig, AlipayProvider

        providers["alipay"] = AlipayProvider(
            AlipayConfig(
                app_id=alipay.app_id,
                private_key_pem=alipay.private_key,
                alipay_public_key_pem=alipay.public_key,
                gateway=alipay.gateway,
                seller_id=alipay.seller_id,
            ),
            session,
        )
    if (wechatpay := settings.wechatpay) is not None:
        from .providers.wechatpay import WechatPayConfig, WechatPayProvider

        providers["wechatpay"] = WechatPayProvider(
            WechatPayConfig(
                mchid=wechatpay.mchid,
                appid=wechatpay.appid,
                serial=wechatpay.serial,
                private_key_pem=wechatpay.private_key,
                apiv3_key=wechatpay.apiv3_key,
                public_key_pem=wechatpay.public_key,
                public_key_id=wechatpay.public_key_id,
                base_url=wechatpay.base_url,
            ),
            session,
        )
    return providers


async def fake_providers(
    settings: Settings, redis: Redis, session: aiohttp.ClientSession
) -> tuple[dict[str, Provider], FakeGateway]:
    """Both channels played by the fake, with the keys every process shares."""
    from .fake import FakeGateway, FakeKeys  # only ever loaded when the fake is on
    from .providers.alipay import AlipayProvider
    from .providers.wechatpay import WechatPayProvider

    keys = await FakeKeys.shared(redis)
    # Browsers follow Alipay's checkout URL, so an app process names the public
    # origin; a worker only queries and refunds, from wherever it runs.
    base = settings.payments.fake_gateway_url or settings.base_url
    providers: dict[str, Provider] = {
        "alipay": AlipayProvider(keys.alipay_config(base), session),
        "wechatpay": WechatPayProvider(keys.wechatpay_config(base), session),
    }
    return providers, FakeGateway(keys, redis, session, public_url=settings.base_url)


@contextlib.asynccontextmanager
async def opened(
    settings: Settings, redis: Redis
) -> AsyncIterator[tuple[dict[str, Provider], OrderStore, FakeGateway | None]]:
    """Build the providers on one HTTP client session; close it at the end.

    With `payments.fake` the fake plays both channels (and its gateway is
    returned too); without Redis it has no keys, so no channel is offered.
    """
    async with aiohttp.ClientSession(timeout=PROVIDER_TIMEOUT) as session:
        gateway = None
        if not settings.payments.fake:
            providers = real_providers(settings.payments, session)
        else:
            try:
                providers, gateway = await fake_providers(settings, redis, session)
            except STORE_ERRORS as err:
                _LOGGER.warning("fake provider keys: %s", type(err).__name__)
                providers = {}
        yield providers, order_store(settings, redis), gateway


async def payments_ctx(app: web.Application) -> AsyncIterator[None]:
    """Give the app its providers and order store; run the reconciler in `make run`."""
    settings = app[SETTINGS]
    real_wechat = settings.payments.wechatpay and not settings.payments.fake
    if real_wechat and not settings.base_url.startswith("https://"):
        _LOGGER.warning(
            "WeChat Pay sends its notices only to https: STUDIO_BASE_URL is %s, so"
            " payments are credited only by asking it (the reconciler)",
            settings.base_url,
        )
    async with opened(settings, app[REDIS]) as (providers, store, gateway):
        app[PROVIDERS] = providers
        app[ORDERS] = store
        if gateway is not None:
            from .fake import FAKE_GATEWAY  # only ever loaded when the fake is on

            app[FAKE_GATEWAY] = gateway
        if not app.get(EMBEDDED_WORKER, False):
            yield
            return
        reconciler = Reconciler(
            store,
            providers,
            every=settings.payments.reconcile_seconds,
            after=settings.payments.reconcile_after,
        )
        stop = asyncio.Event()
        task = asyncio.create_task(reconciler.run(stop), name="reconciler")
        yield
        stop.set()
        await task
