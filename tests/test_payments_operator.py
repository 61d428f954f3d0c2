"""`studio payments ...` as operators run it: refunds by the policy, safe to rerun."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis

from service.payments.orders import order_key
from service.settings import ROOT
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import LEDGER

from .conftest import TEST_SECRET, SettingsFactory
from .processes import studio_environ
from .shop import Shop, buy, credits, get_order, open_shop, pay
from .workbench import Finished, sign_in, studio_command

DAY = 86400


@pytest.fixture
async def shop(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
) -> AsyncIterator[Shop]:
    """The real app (demo upstream on) and the fake provider; signed in."""
    async with open_shop(
        aiohttp_server,
        aiohttp_client,
        make_settings,
        redis,
        STUDIO_DEMO_UPSTREAM="1",
    ) as shop:
        await sign_in(shop.client, mail_server)
        yield shop


def cli_environ(shop: Shop, redis_server: RedisServer) -> dict[str, str]:
    """What the operator's shell holds: the service's own settings."""
    return studio_environ(
        **shop.environ,
        STUDIO_REDIS_URL=redis_server.url,
        STUDIO_SECRET_KEY=TEST_SECRET,
    )


async def payments(shop: Shop, redis_server: RedisServer, *args: str) -> Finished:
    """Run `python -m service payments ARGS...`."""
    return await studio_command(
        "payments", *args, environ=cli_environ(shop, redis_server)
    )


async def bought_and_spent(shop: Shop, channel: str, spend: int) -> str:
    """Buy p98 (980 + 80 credits) and spend `spend` credits (trial first)."""
    order = await buy(shop.client, "p98", channel)
    await pay(shop, order)
    me = await (await shop.client.get("/api/me")).json()
    if spend:
        await shop.client.app[LEDGER].adjust(me["id"], -spend, "spent in a test")
    return str(order["id"])


async def entries(shop: Shop, kind: str) -> list[dict[str, Any]]:
    listed = (await credits(shop.client))["entries"]
    return [entry for entry in listed if entry["kind"] == kind]


@pytest.mark.parametrize(
    ("day", "lines", "paid_back_fen"),
    [
        (
            3,
            [
                "refundable   580 credits x 0.10 = 58.00 yuan",
                "fee          none (day 3; days 1-7 have none)",
                "paid back    58.00 yuan",
            ],
            5800,
        ),
        (
            30,
            [
                "refundable   580 credits x 0.10 = 58.00 yuan",
                "fee          5 % on day 30 = 2.90",
                "paid back    55.10 yuan",
            ],
            5510,
        ),
    ],
)
async def test_a_policy_refund_prints_its_arithmetic_and_pays_back_once(
    shop: Shop,
    redis: Redis,
    redis_server: RedisServer,
    day: int,
    lines: list[str],
    paid_back_fen: int,
) -> None:
    """500 spent (100 trial + 400 of the order): 580 of 980 refundable, less the fee."""
    oid = await bought_and_spent(shop, "wechatpay", 500)
    await redis.hset(order_key(oid), "paid", int(time.time()) - (day - 1) * DAY - 60)
    done = await payments(shop, redis_server, "refund", oid)
    assert done.returncode == 0, done.stderr
    for line in lines:
        assert line in done.stdout, done.stdout
    assert f"{oid}: refunded" in done.stdout
    assert await shop.gateway.refunds(oid) == {f"{oid}-r1": paid_back_fen}
    # The lot's remaining (660, bonus included) leaves with one entry.
    assert [e["amount"] for e in await entries(shop, "purchase_refund")] == [-660]
    assert (await credits(shop.client))["balance"] == 0
    order = await get_order(shop.client, oid)
    assert order["status"] == "refunded"
    assert order["refunded_yuan"] == f"{paid_back_fen // 100}.{paid_back_fen % 100:02d}"
    again = await payments(shop, redis_server, "refund", oid)
    assert again.returncode == 0
    assert "refunded before" in again.stdout
    assert len(await shop.gateway.refunds(oid)) == 1
    shown = await payments(shop, redis_server, "show", oid)
    assert shown.returncode == 0
    assert "status    refunded" in shown.stdout
    assert "amount    98.00 yuan" in shown.stdout
    assert "remaining" in shown.stdout
    assert "notices   1" in shown.stdout


async def test_no_cash_refund_after_day_180_and_unknown_orders_are_refused(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """Day 200: exit 1 TOO_LATE, nothing taken; an unknown order: exit 1."""
    oid = await bought_and_spent(shop, "alipay", 500)
    await redis.hset(order_key(oid), "paid", int(time.time()) - 199 * DAY - 60)
    late = await payments(shop, redis_server, "refund", oid)
    assert late.returncode == 1
    assert "TOO_LATE" in late.stderr
    assert late.stderr.count("\n") == 1
    assert await entries(shop, "purchase_refund") == []
    assert await shop.gateway.refunds(oid) == {}
    missing = await payments(shop, redis_server, "show", "f" * 32)
    assert missing.returncode == 1
    assert missing.stderr.strip() == f"studio: no order {'f' * 32}"
    bad = await payments(shop, redis_server, "frobnicate")
    assert bad.returncode == 2


async def test_query_and_reconcile_credit_an_order_whose_notice_was_lost(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """`payments query` asks the provider and credits; `reconcile` runs one pass."""
    from .test_webhooks import held_payment

    oid, _ = await held_payment(shop, redis, "alipay")
    asked = await payments(shop, redis_server, "query", oid)
    assert (asked.returncode, asked.stdout.strip()) == (0, f"{oid}: paid: credited now")
    assert (await credits(shop.client))["balance"] == 100 + 1060
    again = await payments(shop, redis_server, "query", oid)
    assert again.stdout.strip() == f"{oid}: paid: credited before"
    passed = await payments(shop, redis_server, "reconcile")
    assert passed.returncode == 0
    assert passed.stdout.startswith("reconciled: ")


async def test_a_console_refund_of_spent_credits_holds_generations_until_a_purchase(
    shop: Shop, redis: Redis
) -> None:
    """Refunded at the provider after spending: credits_owed, 402, settled by buying."""
    order = await buy(shop.client, "p30", "alipay")  # 300 credits, no bonus
    await pay(shop, order)
    me = await (await shop.client.get("/api/me")).json()
    await shop.client.app[LEDGER].adjust(me["id"], -350, "spent in a test")
    delivery = await shop.gateway.refund_from_console(order["id"], 3000)
    assert (delivery.status, delivery.answer) == (200, b"success")
    me = await (await shop.client.get("/api/me")).json()
    assert (me["credits"], me["credits_owed"]) == (0, 250)
    submit = await shop.client.post(
        "/api/generations", json={"model": _image_model(), "prompt": "a lighthouse"}
    )
    assert (submit.status, await submit.json()) == (402, {"error": "PAYMENT_HOLD"})
    second = await buy(shop.client, "p98", "wechatpay")
    await pay(shop, second)
    me = await (await shop.client.get("/api/me")).json()
    assert (me["credits"], me["credits_owed"]) == (1060 - 250, 0)
    settles = await entries(shop, "adjust")
    assert next((e["amount"], e["note"]) for e in settles) == (
        -250,
        "settles credits owed",
    )
    submit = await shop.client.post(
        "/api/generations", json={"model": _image_model(), "prompt": "a lighthouse"}
    )
    assert submit.status == 202, await submit.text()


def _image_model() -> str:
    from service.content import load_content

    return next(m.id for m in load_content().models if m.kind == "image")


async def test_a_refund_killed_while_the_provider_holds_it_is_finished_by_a_rerun(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """SIGKILL mid-call, run again: refunded once at the provider, one entry."""
    oid = await bought_and_spent(shop, "wechatpay", 0)
    shop.refunds_open.clear()  # the provider holds the call until told
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", "payments", "refund", oid,
        cwd=ROOT, env=cli_environ(shop, redis_server),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    await asyncio.wait_for(shop.refund_asked.wait(), 30)
    process.send_signal(signal.SIGKILL)
    await process.communicate()
    assert process.returncode == -signal.SIGKILL
    stored = await redis.hget(order_key(oid), "refund_state")
    assert stored == b"pending"  # the credits are taken, the money not yet confirmed
    shop.refunds_open.set()  # the provider finishes the call nobody waits for
    deadline = time.monotonic() + 30
    while not await shop.gateway.refunds(oid):
        assert time.monotonic() < deadline, "the provider never finished the refund"
        await asyncio.sleep(0.02)
    rerun = await payments(shop, redis_server, "refund", oid)
    assert rerun.returncode == 0, rerun.stderr
    assert "sending it again with the same refund id" in rerun.stdout
    assert await shop.gateway.refunds(oid) == {f"{oid}-r1": 9800}
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    assert trade["refunded"] == "9800"
    assert [e["amount"] for e in await entries(shop, "purchase_refund")] == [-1060]
    assert (await get_order(shop.client, oid))["status"] == "refunded"


async def test_a_refund_wechat_is_still_processing_is_finished_by_its_notice(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """PROCESSING: the credits are taken, the order is not `refunded` until the
    money moved; its REFUND.SUCCESS notice finishes it (reference I §2.5)."""
    oid = await bought_and_spent(shop, "wechatpay", 0)
    shop.gateway.refund_status = "PROCESSING"
    done = await payments(shop, redis_server, "refund", oid)
    assert done.returncode == 0, done.stderr
    assert "still processing" in done.stdout
    assert f"{oid}: refunded" not in done.stdout
    assert await redis.hget(order_key(oid), "refund_state") == b"pending"
    assert (await get_order(shop.client, oid))["status"] == "paid"
    assert [e["amount"] for e in await entries(shop, "purchase_refund")] == [-1060]
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    notice = shop.gateway.wechat_refund_notice(oid, trade, f"{oid}-r1", 9800)
    delivery = await shop.gateway.deliver(notice)
    assert delivery.status == 204
    assert await redis.hget(order_key(oid), "refund_state") == b"done"
    order = await get_order(shop.client, oid)
    assert (order["status"], order["refunded_yuan"]) == ("refunded", "98.00")
    assert [e["amount"] for e in await entries(shop, "purchase_refund")] == [-1060]


async def test_a_console_refund_counts_beside_ours_whose_notice_never_came(
    shop: Shop, redis: Redis, redis_server: RedisServer
) -> None:
    """WeChat reports refunds one by one: ours (58 yuan, no notice) and then a
    console one of 40 yuan take 400 credits more, not 0 (the sum, not the last)."""
    oid = await bought_and_spent(shop, "wechatpay", 500)
    done = await payments(shop, redis_server, "refund", oid)
    assert done.returncode == 0, done.stderr
    assert await shop.gateway.refunds(oid) == {f"{oid}-r1": 5800}
    delivery = await shop.gateway.refund_from_console(oid, 9800)
    assert delivery.status == 204
    me = await (await shop.client.get("/api/me")).json()
    assert (me["credits"], me["credits_owed"]) == (0, 400)
    again = await shop.gateway.deliver(delivery)  # a repeat takes nothing more
    assert again.status == 204
    me = await (await shop.client.get("/api/me")).json()
    assert me["credits_owed"] == 400


async def test_an_abnormal_or_closed_refund_is_logged_for_a_person_and_changes_nothing(
    shop: Shop,
    redis: Redis,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """REFUND.ABNORMAL / REFUND.CLOSED: acknowledged, an error in the log."""
    oid = await bought_and_spent(shop, "wechatpay", 0)
    shop.gateway.refund_status = "PROCESSING"
    assert (await payments(shop, redis_server, "refund", oid)).returncode == 0
    before = await redis.hgetall(order_key(oid))
    trade = await shop.gateway.trade(oid)
    assert trade is not None
    for event in ("REFUND.ABNORMAL", "REFUND.CLOSED"):
        resource = {
            "mchid": shop.gateway.keys.mchid, "out_trade_no": oid,
            "transaction_id": trade["trade_no"], "out_refund_no": f"{oid}-r1",
            "refund_id": "50" + "1" * 27, "refund_status": event.split(".")[1],
            "amount": {"total": 9800, "refund": 9800, "payer_total": 9800,
                       "payer_refund": 9800},
        }  # fmt: skip
        notice = shop.gateway.wechat_notice(
            trade["notify_url"], event, "refund", resource
        )
        with caplog.at_level(logging.ERROR, logger="service.payments.webhooks"):
            assert (await shop.gateway.deliver(notice)).status == 204
        assert f"order {oid}: refund {oid}-r1 ABNORMAL or CLOSED" in caplog.text
    after = await redis.hgetall(order_key(oid))
    assert {k: v for k, v in after.items() if k != b"notices"} == {
        k: v for k, v in before.items() if k != b"notices"
    }
    assert (await get_order(shop.client, oid))["status"] == "paid"
