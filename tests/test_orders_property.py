"""Random payments, spends and refunds on real Redis never break the books."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from redis.asyncio import Redis

from service.payments.orders import AmountMismatch, NotRefundable, OrderStore, Pack
from service.store.embedded import RedisServer
from service.studio.generations import GenerationStore, SubmitRefused
from service.studio.ledger import InsufficientCredits, Ledger, account_key

from .ports import free_port

ACCOUNT = "b" * 24
DAY = 86400
PACKS = (Pack("p30", 30, 300, 0), Pack("p98", 98, 980, 80), Pack("p1", 1, 10, 3))


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """One Redis-compatible server for this module's examples."""
    with RedisServer(port=free_port()) as server:
        yield server


class Books(RuleBasedStateMachine):
    """Drive the real stores from hypothesis's sync rules through one event loop."""

    orders = Bundle("orders")
    url = ""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.redis: Redis = self.run(self._connect())
        self.ledger = Ledger(self.redis, trial_credits=0, expire_months=24)
        self.store = OrderStore(self.redis, order_minutes=15, expire_months=24)
        self.generations = GenerationStore(self.redis)
        self.paid: set[str] = set()
        self.gids: list[str] = []
        self.counter = 0

    def run(self, coroutine: Any) -> Any:
        """Run one coroutine on this example's loop."""
        return self.runner.run(coroutine)

    async def _connect(self) -> Redis:
        client = Redis.from_url(self.url)
        await client.flushdb()
        return client

    def teardown(self) -> None:
        """Close the client and the loop of this example."""
        self.run(self.redis.aclose())
        self.runner.close()

    def account(self) -> tuple[int, int]:
        """Read the balance and the credits owed."""
        numbers = self.run(self.redis.hmget(account_key(ACCOUNT), ["balance", "owed"]))
        balance, owed = (int(n or 0) for n in numbers)
        return balance, owed

    def order(self, order_id: str) -> dict[str, str]:
        """Read an order's fields."""
        fields = self.run(self.store.get(order_id))
        assert fields is not None
        return dict(fields)

    @initialize(trial=st.integers(0, 50))
    def open_account(self, trial: int) -> None:
        """Open the account, with or without trial credits."""
        self.ledger = Ledger(self.redis, trial_credits=trial, expire_months=24)
        self.run(self.ledger.open(ACCOUNT, "p@example.com", "z" * 32))

    @rule(target=orders, pack=st.sampled_from(PACKS))
    def create(self, pack: Pack) -> str:
        """Create an order of a pack."""
        order, _ = self.run(self.store.create(ACCOUNT, pack, "alipay", "desktop"))
        return str(order["id"])

    @rule(order_id=orders, copies=st.integers(1, 4), together=st.booleans())
    def pay(self, order_id: str, copies: int, together: bool) -> None:
        """Deliver the payment once or several times, one after another or at once."""
        fields, (balance, owed) = self.order(order_id), self.account()
        fen = int(fields["fen"])

        async def deliver() -> list[bool]:
            calls = [self.store.pay(order_id, "T", fen) for _ in range(copies)]
            if together:
                return list(await asyncio.gather(*calls))
            return [await call for call in calls]

        credited = self.run(deliver())
        assert credited.count(True) == (0 if order_id in self.paid else 1)
        assert credited.count(True) + credited.count(False) == copies
        if True in credited:  # credits owed are settled from the new balance
            have = balance + int(fields["credits"]) + int(fields["bonus"])
            settled = min(owed, have)
            assert self.account() == (have - settled, owed - settled)
        self.paid.add(order_id)

    @rule(order_id=orders, off=st.sampled_from([-1, 1, -100]))
    def pay_another_amount(self, order_id: str, off: int) -> None:
        """A payment of the wrong amount changes nothing."""
        before = (self.order(order_id), self.account())
        with pytest.raises(AmountMismatch):
            self.run(self.store.pay(order_id, "T", int(before[0]["fen"]) + off))
        assert (self.order(order_id), self.account()) == before

    @rule(order_id=orders, late=st.booleans())
    def expire(self, order_id: str, late: bool) -> None:
        """Expire an order now (too early) or after its 15 minutes."""
        status = self.order(order_id)["status"]
        moment = time.time() + (16 * 60 if late else 0)
        expired = self.run(self.store.expire(order_id, moment))
        assert expired == (late and status == "created")

    @rule(amount=st.integers(1, 400), through_submit=st.booleans())
    def spend(self, amount: int, through_submit: bool) -> None:
        """Spend credits: a generation's debit, or an operator's take-back."""
        balance, owed = self.account()
        if through_submit:
            self.counter += 1
            gid = f"g{self.counter}"
            submitted = self.generations.submit(
                ACCOUNT, gid, price=amount, cap=10_000, idempotency="",
                body_hash="h", deadline=0, fields={"model": "m"},
            )  # fmt: skip
            refused = ""
            try:
                self.run(submitted)
            except SubmitRefused as refusal:
                refused = refusal.code
            if refused:
                assert refused == ("PAYMENT_HOLD" if owed else "INSUFFICIENT_CREDITS")
                assert owed or amount > balance
                return
            assert not owed
            assert amount <= balance
            self.gids.append(gid)
        else:
            try:
                self.run(self.ledger.adjust(ACCOUNT, -amount, "spent"))
            except InsufficientCredits:
                assert amount > balance
                return
        assert self.account()[0] == balance - amount

    @rule(pick=st.integers(0, 1000))
    def fail_generation(self, pick: int) -> None:
        """A generation fails: its credits go back to the lots they came from."""
        if not self.gids:
            return
        gid = self.gids[pick % len(self.gids)]
        self.run(self.generations.settle(ACCOUNT, gid, "fail", "UPSTREAM_FAILED"))

    @rule(amount=st.integers(1, 200))
    def grant(self, amount: int) -> None:
        """An operator grants bonus credits."""
        self.run(self.ledger.adjust(ACCOUNT, amount, "grant"))

    @rule(order_id=orders, day=st.integers(1, 200), finish=st.booleans())
    def policy_refund(self, order_id: str, day: int, finish: bool) -> None:
        """The operator refunds an order by the policy, maybe twice."""
        fields = self.order(order_id)
        now = float(fields["paid"] or time.time()) + (day - 1) * DAY + 60
        try:
            refund = self.run(self.store.begin_refund(order_id, now))
        except NotRefundable as refused:
            if refused.code == "NOT_PAID":
                assert order_id not in self.paid
            if refused.code == "TOO_LATE":
                assert day > 180
            return
        assert order_id in self.paid
        assert self.run(self.store.begin_refund(order_id, now)) == refund
        if not fields["refund_state"]:  # begun now: its money counts as covered
            covered = int(fields["covered_fen"]) + refund.fen
            assert covered == int(self.order(order_id)["covered_fen"])
            assert covered <= int(fields["fen"])
        if finish:
            self.run(self.store.finish_refund(order_id))
            assert self.order(order_id)["status"] == "refunded"

    @rule(order_id=orders, cumulative=st.integers(0, 120_000))
    def provider_refund(self, order_id: str, cumulative: int) -> None:
        """The provider reports a cumulative refund: maybe a repeat, maybe older."""
        before, (balance, owed) = self.order(order_id), self.account()
        if order_id not in self.paid:
            with pytest.raises(NotRefundable, match="NOT_PAID"):
                self.run(self.store.provider_refunded(order_id, cumulative))
            return
        cost = self.run(self.store.provider_refunded(order_id, cumulative))
        covered = int(before["covered_fen"])
        figure = min(cumulative, int(before["fen"]))
        expected = figure // 10 - covered // 10 if figure > covered else 0
        assert cost == expected
        after_balance, after_owed = self.account()
        assert (balance - after_balance) + (after_owed - owed) == cost
        if after_owed > owed:  # only what the balance could not give is owed
            assert after_balance == 0

    @invariant()
    def books_agree(self) -> None:
        """Entries and lots add up to the balance; nothing is negative."""
        key = account_key(ACCOUNT)
        entries = [
            json.loads(e) for e in self.run(self.redis.lrange(f"{key}:ledger", 0, -1))
        ]
        lots = [
            json.loads(v) for v in self.run(self.redis.hgetall(f"{key}:lot")).values()
        ]
        balance, owed = self.account()
        assert balance == sum(e["amount"] for e in entries)
        assert balance == sum(lot["remaining"] for lot in lots)
        assert balance >= 0
        assert owed >= 0
        assert all(e["balance_after"] >= 0 for e in entries)
        assert all(lot["remaining"] >= 0 for lot in lots)
        purchases = [e["order_id"] for e in entries if e["kind"] == "purchase"]
        assert len(purchases) == len(set(purchases)) == len(self.paid)
        assert set(purchases) == self.paid

    @invariant()
    def refunds_stay_within_payments(self) -> None:
        """No order returns more money than was paid for it, nor any unpaid."""
        orders = self.run(self.store.page(ACCOUNT, before=None, limit=1000))[0]
        for fields in orders:
            fen, refunded = int(fields["fen"]), int(fields["refunded_fen"])
            assert 0 <= refunded <= int(fields["covered_fen"]) <= fen
            if fields["id"] not in self.paid:
                assert fields["status"] in ("created", "expired")
                assert refunded == 0


@pytest.mark.timeout(600)  # a failure's shrinking replays many examples
def test_random_payments_spends_and_refunds_keep_the_books(
    own_server: RedisServer,
) -> None:
    """Any sequence keeps entries = lots = balance >= 0 and refunds <= payments."""
    Books.url = own_server.url
    run_state_machine_as_test(
        Books,
        settings=settings(
            max_examples=200,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
