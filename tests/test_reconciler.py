"""The reconciler: orders whose notice never came are asked about, credited, expired."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, cast

import aiohttp
import pytest
from redis.asyncio import Redis

from service.payments.keys import ORDERS, PROVIDERS
from service.payments.orders import OPEN, OrderStore, order_key
from service.payments.providers.base import Provider
from service.payments.providers.wechatpay import WechatPayProvider
from service.payments.reconciler import Reconciler
from service.store.embedded import RedisServer

from .conftest import TEST_SECRET
from .payments import fake_keys
from .shop import Shop, buy, credits
from .test_webhooks import held_payment, stored_status
from .workbench import worker_process


async def test_a_worker_process_credits_an_order_whose_notice_never_came(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """`studio worker` asks the provider about old `created` orders and credits them."""
    paid, _ = await held_payment(shop, redis, "alipay")
    unpaid = (await buy(shop.client, "p30", "wechatpay"))["id"]
    environ = {
        **shop.environ,
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_PAYMENTS_RECONCILE_SECONDS": "0.5",
        "STUDIO_PAYMENTS_RECONCILE_AFTER": "0",
    }
    with worker_process(environ) as worker:
        deadline = time.monotonic() + 30
        while await stored_status(redis, paid) != "paid":
            assert worker.poll() is None, "the worker exited"
            assert time.monotonic() < deadline, "never credited"
            await asyncio.sleep(0.2)
    assert (await credits(shop.client))["balance"] == 100 + 1060
    assert await stored_status(redis, unpaid) == "created"
    assert await redis.zscore(OPEN, paid) is None
    assert await redis.zscore(OPEN, unpaid) is not None
    assert float(await redis.hget(order_key(unpaid), "asked") or 0) > 0


async def test_a_pass_expires_forgets_and_tells_a_down_provider_once(
    shop: Shop, redis: Redis, caplog: pytest.LogCaptureFixture
) -> None:
    """Past expiry: expired; an hour on: not asked; a dead provider: one line."""
    store = shop.client.app[ORDERS]
    configured = shop.client.app[PROVIDERS]
    providers: dict[str, Provider] = dict(configured)
    now = time.time()
    late = (await buy(shop.client, "p30", "alipay"))["id"]
    gone = (await buy(shop.client, "p30", "alipay"))["id"]
    await redis.hset(order_key(late), "expires", int(now) - 10)
    await redis.hset(order_key(gone), "expires", int(now) - 3700)
    reconciler = Reconciler(store, providers, every=30, after=0)
    outcomes = await reconciler.pass_once(now + 1)
    assert outcomes == {"expired": 1, "forgotten": 1}
    assert await stored_status(redis, late) == "expired"
    assert await redis.zscore(OPEN, late) is not None  # asked until an hour past
    assert await redis.zscore(OPEN, gone) is None
    # WeChat Pay unreachable: every order of it fails, one warning per pass.
    first = (await buy(shop.client, "p30", "wechatpay"))["id"]
    second = (await buy(shop.client, "p30", "wechatpay"))["id"]
    async with aiohttp.ClientSession() as session:
        providers["wechatpay"] = WechatPayProvider(
            fake_keys().wechatpay_config("http://127.0.0.1:9"), session
        )
        caplog.clear()
        with caplog.at_level(logging.WARNING, "service.payments.reconciler"):
            outcomes = await reconciler.pass_once(time.time() + 60)
    assert outcomes["unreachable"] == 1
    assert outcomes["unasked"] >= 1
    warnings = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(warnings) == 1
    for oid in (first, second):
        assert await stored_status(redis, oid) == "created"
        assert await redis.zscore(OPEN, oid) is not None


class _ListedTogether:
    """The order store, whose open list each caller gets once all have read it."""

    def __init__(self, store: OrderStore, listed: asyncio.Barrier) -> None:
        self._store = store
        self._listed = listed

    async def open_orders(self, **query: Any) -> list[str]:
        found = await self._store.open_orders(**query)
        await self._listed.wait()
        return found

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_two_reconcilers_at_once_credit_once_and_ask_once(
    shop: Shop, redis: Redis
) -> None:
    """Every worker runs one: racing passes credit once and ask the provider once."""
    _paid, _ = await held_payment(shop, redis, "wechatpay")
    store = shop.client.app[ORDERS]
    providers = shop.client.app[PROVIDERS]
    # Every pass lists the open orders before any goes on, as passes of workers
    # started together do; on a busy machine one could otherwise finish first.
    listed = asyncio.Barrier(4)
    racing = cast(OrderStore, _ListedTogether(store, listed))
    reconcilers = [Reconciler(racing, providers, every=30, after=0) for _ in range(4)]
    now = time.time() + 1
    results = await asyncio.gather(*(r.pass_once(now) for r in reconcilers))
    total = sum(results, Counter[str]())
    assert total["credited"] == 1
    # The others found it asked about (or already paid): none asked again.
    assert total["already"] == 0
    assert total["unasked"] + total["settled"] == 3, total
    assert (await credits(shop.client))["balance"] == 100 + 1060
