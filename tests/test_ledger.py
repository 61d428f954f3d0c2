"""The ledger's invariants: entries, lots and balance always agree; never below 0."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from redis.asyncio import Redis

from service.store.embedded import RedisServer
from service.studio.generations import GenerationStore, SubmitRefused, Submitted
from service.studio.ledger import (
    MAX_ADJUST,
    InsufficientCredits,
    Ledger,
    account_key,
    events_channel,
    script,
)

from .chaos import late_replies

Operation = tuple[str, int]


async def _views(redis: Redis, account_id: str) -> tuple[int, int, int, list[Any]]:
    key = account_key(account_id)
    balance = int(await redis.hget(key, "balance") or 0)
    entries = [json.loads(e) for e in await redis.lrange(f"{key}:ledger", 0, -1)]
    lots = [json.loads(v) for v in (await redis.hgetall(f"{key}:lot")).values()]
    return (
        balance,
        sum(e["amount"] for e in entries),
        sum(lot["remaining"] for lot in lots),
        entries,
    )


async def _expired(redis: Redis, account_id: str) -> None:
    """Date the account's trial lot in the past: the next change sweeps it."""
    key = account_key(account_id)
    lot = json.loads(await redis.hget(f"{key}:lot", "l1") or "")
    lot["expires"] = 1
    await redis.hset(f"{key}:lot", "l1", json.dumps(lot))


async def test_debits_take_trial_and_bonus_first_soonest_expiry_first(
    redis: Redis,
) -> None:
    """A bonus that expires before the trial lot is spent first; refunds go back."""
    ledger = Ledger(redis, trial_credits=10, expire_months=24)
    await ledger.open("u1", "a@example.com", "x" * 32)
    key = account_key("u1")
    await ledger.adjust("u1", 5, "compensation")
    # make the bonus lot expire sooner than the trial lot
    bonus = json.loads(await redis.hget(f"{key}:lot", "l2") or "")
    bonus["expires"] -= 10**6
    await redis.hset(f"{key}:lot", "l2", json.dumps(bonus))
    await redis.zadd(f"{key}:lots", {"l2": bonus["expires"]})
    store = GenerationStore(redis)
    submitted = await store.submit(
        "u1", "g1", price=7, cap=4, idempotency="", body_hash="h", deadline=0,
        fields={"model": "m", "kind": "image", "prompt": "p", "size": "1x1",
                "count": 1, "seed": 1},
    )  # fmt: skip
    assert json.loads(submitted.fields["lots"]) == {"l2": 5, "l1": 2}
    outcome, _ = await store.settle("u1", "g1", "fail", "UPSTREAM_FAILED")
    assert outcome == "OK"
    page = await ledger.page("u1", before=None, limit=10)
    assert {lot["id"]: lot["remaining"] for lot in page.lots} == {"l1": 10, "l2": 5}
    assert [lot["kind"] for lot in page.lots] == ["bonus", "trial"]


async def test_credits_that_expire_under_a_refused_submit_send_a_credits_event(
    redis: Redis,
) -> None:
    """CONTRACT §6: a credits event on every balance change, a refusal's too."""
    ledger = Ledger(redis, trial_credits=10, expire_months=24)
    await ledger.open("u7", "g@example.com", "z" * 32)
    await _expired(redis, "u7")
    async with redis.pubsub() as listening:
        await listening.subscribe(events_channel("u7"))
        await listening.get_message(timeout=1)  # the subscription itself
        with contextlib.suppress(SubmitRefused):
            await GenerationStore(redis).submit(
                "u7", "g1", price=5, cap=4, idempotency="", body_hash="h",
                deadline=0, fields={"model": "m", "kind": "image", "prompt": "p",
                                    "size": "1x1", "count": 1, "seed": 1},
            )  # fmt: skip
        message = await listening.get_message(timeout=2)
    assert message is not None
    assert json.loads(message["data"]) == {"event": "credits", "data": {"balance": 0}}


async def test_a_submit_retried_after_its_reply_was_lost_charges_once(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Redis ran the submit but its reply came after the socket timeout: the
    client's retry finds the generation made and answers with it, with one
    debit, one job queued and the balance taken once."""
    await Ledger(redis, trial_credits=10, expire_months=24).open(
        "u9", "r@example.com", "r" * 32
    )
    fields: dict[str, str | int] = {"model": "m", "kind": "image", "prompt": "p"}
    async with late_replies(redis_server.port) as (slow, late):
        store = GenerationStore(slow)

        def submit(gid: str) -> Awaitable[Submitted]:
            return store.submit(
                "u9", gid, price=3, cap=4, idempotency="", body_hash="",
                deadline=0, fields=fields,
            )  # fmt: skip

        await submit("g0")  # the script is loaded: the next try runs at once
        submitted = await late(submit("g1"))
    assert (submitted.fields["id"], submitted.replayed) == ("g1", False)
    balance, total, remaining, entries = await _views(redis, "u9")
    assert [e["kind"] for e in entries] == ["grant", "debit", "debit"]
    assert (balance, total, remaining) == (4, 4, 4)
    streams = await redis.keys("studio:jobs:*:stream")
    assert sum([await redis.xlen(stream) for stream in streams]) == 2


async def test_an_operators_grant_retried_after_its_reply_was_lost_grants_once(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The same for `credits grant`: one adjust entry, the balance moved once."""
    await Ledger(redis, trial_credits=10, expire_months=24).open(
        "u10", "o@example.com", "o" * 32
    )
    async with late_replies(redis_server.port) as (slow, late):
        ledger = Ledger(slow, trial_credits=10, expire_months=24)
        assert await ledger.adjust("u10", 1, "") == 11  # the script is loaded
        assert await late(ledger.adjust("u10", 5, "compensation")) == 16
        assert await late(ledger.adjust("u10", -2, "")) == 14
    balance, total, remaining, entries = await _views(redis, "u10")
    assert [e["amount"] for e in entries] == [10, 1, 5, -2]
    assert (balance, total, remaining) == (14, 14, 14)


async def test_expired_credits_leave_with_an_expire_entry(redis: Redis) -> None:
    """A lot past its expiry is swept out of the balance by the next change."""
    ledger = Ledger(redis, trial_credits=10, expire_months=24)
    await ledger.open("u2", "b@example.com", "y" * 32)
    await _expired(redis, "u2")
    assert await ledger.adjust("u2", 3, "") == 3
    page = await ledger.page("u2", before=None, limit=10)
    assert [e["kind"] for e in reversed(page.entries)] == ["grant", "expire", "adjust"]
    assert page.balance == 3


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["grant", "take", "submit", "fail", "cancel", "succeed"]),
            st.integers(1, 40),
        ),
        max_size=30,
    )
)
async def test_any_sequence_keeps_entries_lots_and_balance_equal(
    redis: Redis, operations: list[Operation]
) -> None:
    """Random grants, take-backs, submits and settlements never break the books."""
    await redis.flushdb()
    ledger = Ledger(redis, trial_credits=20, expire_months=24)
    store = GenerationStore(redis)
    await ledger.open("u3", "c@example.com", "z" * 32)
    gids: list[str] = []
    refunded: set[str] = set()
    for number, (kind, amount) in enumerate(operations):
        if kind == "grant":
            await ledger.adjust("u3", amount, "")
        elif kind == "take":
            with contextlib.suppress(InsufficientCredits):  # would go below zero
                await ledger.adjust("u3", -amount, "")
        elif kind == "submit":
            with contextlib.suppress(SubmitRefused):  # INSUFFICIENT_CREDITS
                await store.submit(
                    "u3", f"g{number}", price=amount, cap=1000, idempotency="",
                    body_hash="h", deadline=0, fields={"model": "m"},
                )  # fmt: skip
                gids.append(f"g{number}")
        elif gids:
            gid = gids[amount % len(gids)]
            action = {"fail": "fail", "cancel": "cancel", "succeed": "succeed"}[kind]
            extra = ["UPSTREAM_FAILED"] if action == "fail" else []
            extra = ["[]"] if action == "succeed" else extra
            outcome, _ = await store.settle("u3", gid, action, *extra)
            if outcome == "OK" and action != "succeed":
                assert gid not in refunded
                refunded.add(gid)
        balance, entries_sum, lots_sum, entries = await _views(redis, "u3")
        assert balance == entries_sum == lots_sum
        assert balance >= 0
        assert all(e["balance_after"] >= 0 for e in entries)
    refunds = [e for e in (await _views(redis, "u3"))[3] if e["kind"] == "refund"]
    assert len(refunds) == len({e["generation_id"] for e in refunds})


async def test_the_adjust_script_refuses_an_amount_out_of_bounds_before_writing(
    redis: Redis,
) -> None:
    """Whatever calls it: a lot written and a balance refused would disagree."""
    ledger = Ledger(redis, trial_credits=10, expire_months=24)
    await ledger.open("u9", "u9@example.com", "addr-u9")
    before = await _views(redis, "u9")
    adjust = script(redis, "adjust")  # the script itself, past the Python bound
    for amount in (MAX_ADJUST + 1, -(MAX_ADJUST + 1), 1.5, 0):
        reply = await adjust(
            keys=[account_key("u9")],
            args=[amount, "", 1_764_000_000, "2025-11-24T00:00:00Z", 1_830_000_000,
                  "2027-12-31T00:00:00Z", MAX_ADJUST],
        )  # fmt: skip
        assert reply == [b"BAD_AMOUNT"]
    assert await _views(redis, "u9") == before
    with pytest.raises(ValueError, match="the amount must be"):
        await ledger.adjust("u9", MAX_ADJUST + 1, "")
