"""Orders on real Redis: credited once, refunded by the policy, debts settled."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from service.content import load_content
from service.payments.orders import (
    NOTICES,
    OPEN,
    AmountMismatch,
    IdempotencyKeyReused,
    NotRefundable,
    OrderStore,
    Pack,
    Refund,
    UnknownOrder,
    account_of,
    packs_of,
    view,
)
from service.store.embedded import RedisServer
from service.studio.generations import GenerationStore, SubmitRefused
from service.studio.ledger import Ledger, account_key, events_channel

from .chaos import late_replies

P98 = Pack("p98", 98, 980, 80)
P30 = Pack("p30", 30, 300, 0)
DAY = 86400
ACCOUNT = "a" * 24


@pytest.fixture
async def ledger(redis: Redis) -> Ledger:
    """An account with no trial credits, so every credit comes from an order."""
    books = Ledger(redis, trial_credits=0, expire_months=24)
    await books.open(ACCOUNT, "buyer@example.com", "x" * 32)
    return books


@pytest.fixture
def store(redis: Redis) -> OrderStore:
    """The order store as the service builds it."""
    return OrderStore(redis, order_minutes=15, expire_months=24)


async def entries(ledger: Ledger) -> list[dict[str, Any]]:
    """Read the account's whole ledger, oldest first."""
    page = await ledger.page(ACCOUNT, before=None, limit=50)
    return list(reversed(page.entries))


async def bought(store: OrderStore, pack: Pack = P98) -> str:
    """Create an order and pay it; return its id."""
    order, _ = await store.create(ACCOUNT, pack, "alipay", "desktop")
    assert await store.pay(order["id"], "T" + order["id"], pack.fen)
    return order["id"]


async def order_view(store: OrderStore, order_id: str) -> dict[str, Any]:
    """Read an order as the API shows it."""
    fields = await store.get(order_id)
    assert fields is not None
    return view(fields, time.time())


async def submit(redis: Redis, gid: str, price: int = 10) -> None:
    """Submit a generation through the real submit script."""
    await GenerationStore(redis).submit(
        ACCOUNT, gid, price=price, cap=100, idempotency="", body_hash="h",
        deadline=0, fields={"model": "m"},
    )  # fmt: skip


async def test_an_order_created_again_after_its_reply_was_lost_is_one_order(
    redis_server: RedisServer, redis: Redis, ledger: Ledger
) -> None:
    """Redis made the order but its reply came after the socket timeout: the
    client's retry finds its own order by the call's token, not a clash to
    draw a new id for (which left a second, never-shown order to expire)."""
    async with late_replies(redis_server.port) as (slow, late):
        orders = OrderStore(slow, order_minutes=15, expire_months=24)
        await orders.create(ACCOUNT, P30, "alipay", "desktop")  # loads the script
        order, replayed = await late(orders.create(ACCOUNT, P98, "alipay", "desktop"))
    assert (order["pack"], replayed) == ("p98", False)
    listed = await redis.zrange(f"{account_key(ACCOUNT)}:orders", 0, -1)
    assert len(listed) == 2  # the first order, and this one once
    assert order["id"].encode() in listed


async def test_a_repeated_payment_credits_the_order_once(
    store: OrderStore, ledger: Ledger
) -> None:
    """A resent notice finds the order paid and changes nothing."""
    order, replayed = await store.create(ACCOUNT, P98, "alipay", "desktop")
    assert not replayed
    assert order["status"] == "created"
    assert await store.pay(order["id"], "T1", 9800)
    assert not await store.pay(order["id"], "T1", 9800)
    page = await ledger.page(ACCOUNT, before=None, limit=50)
    assert page.balance == 1060
    assert [(e["kind"], e["amount"], e["order_id"]) for e in page.entries] == [
        ("purchase", 1060, order["id"])
    ]
    assert [(lot["kind"], lot["granted"], lot["order_id"]) for lot in page.lots] == [
        ("purchase", 1060, order["id"])
    ]
    shown = await order_view(store, order["id"])
    assert shown["status"] == "paid"
    assert shown["paid_at"]
    assert (await store.get(order["id"]) or {})["trade_no"] == "T1"


async def test_twenty_concurrent_payments_credit_the_order_once(
    store: OrderStore, ledger: Ledger
) -> None:
    """Notices and the reconciler racing: exactly one of them credits."""
    order, _ = await store.create(ACCOUNT, P30, "wechatpay", "mobile")
    results = await asyncio.gather(
        *(store.pay(order["id"], f"T{n}", 3000) for n in range(20))
    )
    assert results.count(True) == 1
    assert [e["kind"] for e in await entries(ledger)] == ["purchase"]
    assert (await ledger.page(ACCOUNT, before=None, limit=1)).balance == 300


async def test_a_payment_after_expiry_is_still_credited(
    store: OrderStore, ledger: Ledger, redis: Redis
) -> None:
    """An expired order leaves the open set only when paid, and is credited."""
    order, _ = await store.create(ACCOUNT, P30, "alipay", "mobile")
    later = time.time() + 16 * 60
    assert view(order, later)["status"] == "expired"  # lazily, before expire()
    assert not await store.expire(order["id"], time.time())  # not yet
    assert await store.expire(order["id"], later)
    assert not await store.expire(order["id"], later)
    assert (await order_view(store, order["id"]))["status"] == "expired"
    assert await redis.zscore(OPEN, order["id"]) is not None
    assert await store.pay(order["id"], "T1", 3000)
    assert (await order_view(store, order["id"]))["status"] == "paid"
    assert await redis.zscore(OPEN, order["id"]) is None
    assert [e["amount"] for e in await entries(ledger)] == [300]


async def test_a_payment_of_another_amount_changes_nothing(
    store: OrderStore, ledger: Ledger
) -> None:
    """The amount must be the order's, to the fen."""
    order, _ = await store.create(ACCOUNT, P98, "alipay", "desktop")
    for wrong in (9799, 9801, 0):
        with pytest.raises(AmountMismatch):
            await store.pay(order["id"], "T1", wrong)
    assert await store.get(order["id"]) == order
    assert await entries(ledger) == []
    with pytest.raises(UnknownOrder):
        await store.pay(ACCOUNT + "00000000", "T1", 9800)


@pytest.mark.parametrize(
    ("day", "fen", "fee"), [(1, 8800, 0), (3, 8800, 0), (7, 8800, 0), (8, 8360, 440),
                            (30, 8360, 440), (180, 8360, 440)],
)  # fmt: skip
async def test_the_policy_refund_pays_the_unspent_purchased_credits(
    store: OrderStore, ledger: Ledger, day: int, fen: int, fee: int
) -> None:
    """The policy's example: 98 yuan, 100 spent: 88.00 in the first week, then 83.60."""
    order_id = await bought(store)
    await ledger.adjust(ACCOUNT, -100, "spent")
    paid = float((await store.get(order_id) or {})["paid"])
    now = paid + (day - 1) * DAY + 3600
    quoted = await store.quote(order_id, now)
    assert quoted == Refund(order_id, order_id + "-r1", fen, fee, 880, "")
    assert (await order_view(store, order_id))["refunded_yuan"] == "0.00"
    begun = await store.begin_refund(order_id, now)
    assert begun == Refund(order_id, order_id + "-r1", fen, fee, 880, "pending")
    page = await ledger.page(ACCOUNT, before=None, limit=50)
    assert (page.entries[0]["kind"], page.entries[0]["amount"]) == (
        "purchase_refund",
        -960,  # the lot's remaining, its unused bonus included
    )
    assert page.entries[0]["order_id"] == order_id
    assert page.balance == 0
    assert page.lots == []
    await store.finish_refund(order_id)
    shown = await order_view(store, order_id)
    assert shown["status"] == "refunded"
    assert shown["refunded_yuan"] == f"{fen // 100}.{fen % 100:02d}"
    assert (await store.quote(order_id, now)).state == "done"


async def test_no_cash_refund_after_day_180_or_of_an_unpaid_order(
    store: OrderStore, ledger: Ledger
) -> None:
    """Day 200 is too late; an order never paid or wholly spent has nothing to give."""
    order_id = await bought(store)
    await ledger.adjust(ACCOUNT, -100, "spent")
    paid = float((await store.get(order_id) or {})["paid"])
    with pytest.raises(NotRefundable) as late:
        await store.begin_refund(order_id, paid + 199 * DAY)
    assert late.value.code == "TOO_LATE"
    assert (await ledger.page(ACCOUNT, before=None, limit=1)).balance == 960
    unpaid, _ = await store.create(ACCOUNT, P30, "alipay", "desktop")
    with pytest.raises(NotRefundable) as never:
        await store.quote(unpaid["id"], time.time())
    assert never.value.code == "NOT_PAID"
    await ledger.adjust(ACCOUNT, -900, "spent")  # 60 left: bonus only
    with pytest.raises(NotRefundable) as spent:
        await store.quote(order_id, paid + DAY)
    assert spent.value.code == "NOTHING_TO_REFUND"


async def test_beginning_a_refund_twice_takes_the_credits_once(
    store: OrderStore, ledger: Ledger
) -> None:
    """A retried refund command (or two at once) finds the same refund."""
    order_id = await bought(store)
    paid = float((await store.get(order_id) or {})["paid"])
    first, second = await asyncio.gather(
        store.begin_refund(order_id, paid + 60),
        store.begin_refund(order_id, paid + 60),
    )
    third = await store.begin_refund(order_id, paid + 10 * DAY)
    assert first == second == third
    assert (first.fen, first.credits) == (9800, 980)
    kinds = [e["kind"] for e in await entries(ledger)]
    assert kinds == ["purchase", "purchase_refund"]


async def test_the_notice_of_our_own_refund_changes_nothing(
    store: OrderStore, ledger: Ledger
) -> None:
    """Its cumulative amount is what the refund already covered."""
    order_id = await bought(store)
    paid = float((await store.get(order_id) or {})["paid"])
    refund = await store.begin_refund(order_id, paid + 2 * DAY)
    assert await store.provider_refunded(order_id, refund.fen) == 0
    await store.finish_refund(order_id)
    assert await store.provider_refunded(order_id, refund.fen) == 0
    assert [e["kind"] for e in await entries(ledger)] == ["purchase", "purchase_refund"]
    assert (await order_view(store, order_id))["refunded_yuan"] == "98.00"


async def test_a_console_refund_of_spent_credits_holds_new_generations(
    store: OrderStore, ledger: Ledger, redis: Redis
) -> None:
    """What cannot be taken becomes credits owed until the next purchase settles it."""
    order_id = await bought(store, P30)
    await ledger.adjust(ACCOUNT, -250, "spent")
    assert await store.provider_refunded(order_id, 3000) == 300
    page = await ledger.page(ACCOUNT, before=None, limit=50)
    assert (page.balance, page.owed) == (0, 250)
    assert (page.entries[0]["kind"], page.entries[0]["amount"]) == (
        "purchase_refund",
        -50,
    )
    shown = await order_view(store, order_id)
    assert (shown["status"], shown["refunded_yuan"]) == ("refunded", "30.00")
    with pytest.raises(SubmitRefused) as held:
        await submit(redis, "g1")
    assert held.value.code == "PAYMENT_HOLD"

    second = await bought(store, P30)
    page = await ledger.page(ACCOUNT, before=None, limit=50)
    assert (page.balance, page.owed) == (50, 0)
    settled = page.entries[0]
    assert (settled["kind"], settled["amount"], settled["note"]) == (
        "adjust", -250, "settles credits owed",
    )  # fmt: skip
    assert settled["order_id"] == second
    await submit(redis, "g2")
    assert (await ledger.page(ACCOUNT, before=None, limit=1)).balance == 40


async def test_repeated_and_late_refund_notices_are_taken_once(
    store: OrderStore, ledger: Ledger
) -> None:
    """Cumulative 30 yuan, again, then an older 10 yuan: 300 credits in all."""
    order_id = await bought(store)
    assert await store.provider_refunded(order_id, 3000) == 300
    assert await store.provider_refunded(order_id, 3000) == 0
    assert await store.provider_refunded(order_id, 1000) == 0
    assert await store.provider_refunded(order_id, 3005) == 0  # half a credit
    assert await store.provider_refunded(order_id, 3010) == 1
    refunds = [e for e in await entries(ledger) if e["kind"] == "purchase_refund"]
    assert [e["amount"] for e in refunds] == [-300, -1]
    assert (await order_view(store, order_id))["refunded_yuan"] == "30.10"
    # a figure above the order's amount is clamped to it
    assert await store.provider_refunded(order_id, 99_999) == 980 - 301
    assert (await order_view(store, order_id))["refunded_yuan"] == "98.00"
    page = await ledger.page(ACCOUNT, before=None, limit=1)
    assert (page.balance, page.owed) == (80, 0)


async def test_a_partial_console_refund_lowers_the_policy_refund(
    store: OrderStore, ledger: Ledger
) -> None:
    """Money refunded at the provider is never paid back a second time."""
    order_id = await bought(store)
    assert await store.provider_refunded(order_id, 1005) == 100
    paid = float((await store.get(order_id) or {})["paid"])
    refund = await store.begin_refund(order_id, paid + DAY)
    assert (refund.credits, refund.fen) == (880, 8795)
    await store.finish_refund(order_id)
    assert (await order_view(store, order_id))["refunded_yuan"] == "98.00"
    page = await ledger.page(ACCOUNT, before=None, limit=1)
    assert (page.balance, page.owed) == (0, 0)


async def test_every_change_of_an_order_is_published_with_its_fields(
    store: OrderStore, ledger: Ledger, redis: Redis
) -> None:
    """The SSE stream renders `order` events with view(); `credits` follows payments."""
    listener = redis.pubsub()
    await listener.subscribe(events_channel(ACCOUNT))
    await listener.get_message(timeout=1)  # the subscription's confirmation
    order_id = await bought(store)
    events: list[dict[str, Any]] = []
    while (message := await listener.get_message(timeout=0.5)) is not None:
        events.append(json.loads(message["data"]))
    await listener.aclose()  # type: ignore[no-untyped-call]
    assert [e["event"] for e in events] == ["order", "credits", "order"]
    assert events[1]["data"] == {"balance": 1060}
    assert view(events[0]["data"], time.time())["status"] == "created"
    assert view(events[2]["data"], time.time()) == await order_view(store, order_id)


async def test_orders_are_listed_newest_first_and_shown_as_the_contract_says(
    store: OrderStore, ledger: Ledger
) -> None:
    """Pages by sequence number; the view has exactly the contract's fields."""
    ids = [(await store.create(ACCOUNT, P30, "alipay", "desktop"))[0]["id"]
           for _ in range(5)]  # fmt: skip
    first, cursor = await store.page(ACCOUNT, before=None, limit=3)
    assert [o["id"] for o in first] == ids[:1:-1]
    assert cursor == 3
    rest, cursor = await store.page(ACCOUNT, before=3, limit=3)
    assert [o["id"] for o in rest] == ids[1::-1]
    assert cursor is None
    shown = await order_view(store, ids[0])
    assert shown == {
        "id": ids[0], "pack": "p30", "yuan": 30, "credits": 300, "bonus": 0,
        "channel": "alipay", "status": "created", "refunded_yuan": "0.00",
        "created_at": shown["created_at"], "paid_at": None,
        "expires_at": shown["expires_at"],
    }  # fmt: skip
    assert shown["created_at"].endswith("Z")
    assert shown["expires_at"].endswith("Z")
    assert account_of(ids[0]) == ACCOUNT
    assert account_of(ids[0].upper()) is None
    assert account_of(ACCOUNT) is None
    assert await store.get("not-an-order") is None
    assert [(p.id, p.fen) for p in packs_of(load_content())] == [
        ("p30", 3000), ("p98", 9800), ("p298", 29800), ("p998", 99800),
    ]  # fmt: skip


async def test_an_idempotency_key_gives_the_same_order_for_the_same_body(
    store: OrderStore, ledger: Ledger, redis: Redis
) -> None:
    """Same key and body: the same order; another body: refused."""
    order, replayed = await store.create(
        ACCOUNT, P98, "alipay", "desktop", idempotency_key="k1", body_hash="h1"
    )
    again, replayed_again = await store.create(
        ACCOUNT, P98, "alipay", "desktop", idempotency_key="k1", body_hash="h1"
    )
    assert (replayed, replayed_again) == (False, True)
    assert again["id"] == order["id"]
    with pytest.raises(IdempotencyKeyReused):
        await store.create(
            ACCOUNT, P30, "alipay", "desktop", idempotency_key="k1", body_hash="h2"
        )
    assert len((await store.page(ACCOUNT, before=None, limit=10))[0]) == 1
    assert await store.open_orders(older_than=time.time() + 1) == [order["id"]]
    assert await store.open_orders(older_than=time.time() - 60) == []
    await store.forget_open(order["id"])
    assert await store.open_orders(older_than=time.time() + 1) == []


async def test_the_provider_is_asked_at_most_every_five_seconds(
    store: OrderStore, ledger: Ledger
) -> None:
    """Many readers of a `created` order make one provider query."""
    order, _ = await store.create(ACCOUNT, P30, "alipay", "desktop")
    now = time.time()
    assert await store.mark_asked(order["id"], now)
    assert not await store.mark_asked(order["id"], now + 4.9)
    assert await store.mark_asked(order["id"], now + 5.0)


async def test_notices_are_audited_and_only_handled_ones_remembered(
    store: OrderStore,
) -> None:
    """A failure never hides the provider's resend; a success answers it at once."""
    oid = ACCOUNT + "0" * 8
    await store.record_notice(
        "alipay", "n1", oid, verified=False, outcome="BAD_SIGNATURE"
    )
    await store.record_notice("alipay", "n2", oid, verified=True, outcome="MISMATCH")
    assert not await store.handled("alipay", "n1")
    assert not await store.handled("alipay", "n2")
    await store.record_notice("alipay", "n2", oid, verified=True, outcome="ok")
    assert await store.handled("alipay", "n2")
    assert not await store.handled("wechatpay", "n2")
    seen = await store.notices()
    assert [(n["event_id"], n["verified"], n["outcome"]) for n in seen] == [
        ("n2", "1", "ok"), ("n2", "1", "MISMATCH"), ("n1", "0", "BAD_SIGNATURE"),
    ]  # fmt: skip
    assert seen[0]["order_id"] == oid
    assert seen[0]["at"].endswith("Z")


async def test_a_flood_of_forged_notices_keeps_the_audit_bounded(
    store: OrderStore, redis: Redis
) -> None:
    """Forged notices are audited, but never more than max_notices of them."""
    store.max_notices = 20
    for n in range(60):
        await store.record_notice(
            "alipay", f"f{n}", "", verified=False, outcome="BAD_SIGNATURE"
        )
    seen = await store.notices(100)
    assert len(seen) == 20
    assert seen[0]["event_id"] == "f59"
    assert await redis.xlen(NOTICES) == 20


async def test_the_providers_action_is_kept_with_the_order(
    store: OrderStore, ledger: Ledger
) -> None:
    """A replay or the QR route reads the action the provider gave."""
    order, _ = await store.create(ACCOUNT, P30, "wechatpay", "desktop")
    await store.keep_action(order["id"], {"type": "qrcode", "code_url": "weixin://x"})
    kept = (await store.get(order["id"]) or {})["action"]
    assert json.loads(kept) == {"type": "qrcode", "code_url": "weixin://x"}
    with pytest.raises(UnknownOrder):
        await store.keep_action(ACCOUNT + "ffffffff", {"type": "redirect", "url": "u"})
