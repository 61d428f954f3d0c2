"""Orders in Redis: every change is one account script, so credits come once."""

from __future__ import annotations

import datetime as dt
import json
import re
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from ..content import Content
from ..store.durable import DurableScripts
from ..studio.ledger import (
    AccountDeleting,
    UnknownAccount,
    account_key,
    add_months,
    iso,
    now as utc_now,
    pairs,
    script,
    text,
)
from .refunds import NotRefundable, policy_refund

__all__ = [
    "AmountMismatch",
    "IdempotencyKeyReused",
    "NotRefundable",
    "OrderStore",
    "Pack",
    "Refund",
    "UnknownOrder",
    "account_of",
    "packs_of",
    "view",
]

_LUA: Final = Path(__file__).parent / "lua"
OPEN: Final = "studio:orders:open"
NOTICES: Final = "studio:payments:notices"
IDEMPOTENCY_SECONDS: Final = 24 * 3600
NOTICE_DAYS: Final = 7
_WEEK: Final = NOTICE_DAYS * 86400
_ORDER_ID: Final = re.compile(r"[0-9a-f]{32}")
# compare-and-set retries of a policy refund whose lot kept changing meanwhile
_REFUND_TRIES: Final = 5


@dataclass(frozen=True, slots=True)
class Pack:
    """A credit pack on sale: its id, price and credits (bonus apart)."""

    id: str
    yuan: int
    credits: int
    bonus: int

    @property
    def fen(self) -> int:
        """Return the price in fen, the unit providers count in."""
        return self.yuan * 100


def packs_of(content: Content) -> tuple[Pack, ...]:
    """Name the packs of content/site.toml "p" + yuan ("p30", "p98", ...)."""
    return tuple(
        Pack(f"p{pack.yuan}", pack.yuan, pack.credits, pack.bonus)
        for pack in content.packs
    )


def account_of(order_id: str) -> str | None:
    """Return the account an order id belongs to (its first 24 characters)."""
    return order_id[:24] if _ORDER_ID.fullmatch(order_id) else None


def order_key(order_id: str) -> str:
    """Name an order's hash, under its account's hash tag."""
    return f"{account_key(order_id[:24])}:order:{order_id}"


def yuan_text(fen: int) -> str:
    """Write fen as yuan with two decimals ("83.60")."""
    return f"{fen // 100}.{fen % 100:02d}"


def view(fields: Mapping[str, str], now: float) -> dict[str, Any]:
    """Render a stored order as the API's JSON object (CONTRACT §8)."""
    status = fields["status"]
    if status == "created" and now >= float(fields["expires"]):
        status = "expired"  # lazily: the reconciler writes it later
    return {
        "id": fields["id"],
        "pack": fields["pack"],
        "yuan": int(fields["yuan"]),
        "credits": int(fields["credits"]),
        "bonus": int(fields["bonus"]),
        "channel": fields["channel"],
        "status": status,
        "refunded_yuan": yuan_text(int(fields.get("refunded_fen") or 0)),
        "created_at": fields["created_at"],
        "paid_at": fields.get("paid_at") or None,
        "expires_at": fields["expires_at"],
    }


class UnknownOrder(Exception):
    """No order has that id."""


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key came with a different body before."""


class AmountMismatch(Exception):
    """A payment's amount is not its order's."""


@dataclass(frozen=True, slots=True)
class Refund:
    """A policy refund: quoted (state ""), begun ("pending") or done ("done").

    `credits` are the refundable credits the money is counted from; the
    ledger's `purchase_refund` entry takes the lot's whole remaining.
    """

    order_id: str
    refund_id: str
    fen: int
    fee_fen: int
    credits: int
    state: str


def refund_id_of(order_id: str) -> str:
    """Name the one policy refund of an order (`out_request_no`/`out_refund_no`)."""
    return f"{order_id}-r1"


def _recorded(fields: Mapping[str, str]) -> Refund:
    return Refund(
        order_id=fields["id"],
        refund_id=fields["refund_id"],
        fen=int(fields["refund_fen"]),
        fee_fen=int(fields["refund_fee"]),
        credits=int(fields["refund_credits"]),
        state=fields["refund_state"],
    )


class OrderStore:
    """Create, pay, expire and refund orders; keep the open set and notice audit."""

    # The notice audit keeps a week, and at most this many notices.
    max_notices: int = 100_000

    def __init__(
        self,
        redis: Redis,
        *,
        order_minutes: int,
        expire_months: int,
        wait_replicas: int = 0,
    ) -> None:
        self._redis = redis
        self._durable = DurableScripts(redis, wait_replicas)
        self._minutes = order_minutes
        self._months = expire_months
        self._orders = script(redis, "orders", _LUA)

    async def _run(
        self, order_id: str, action: str, *args: str | int, durable: bool = False
    ) -> list[Any]:
        keys: Sequence[str] = [account_key(order_id[:24])]
        argv: list[str | int] = [action, order_id, *args]
        if durable:  # it moves credits or money: wait for the replicas
            reply = await self._durable.run(self._orders, keys, argv)
        else:
            reply = await self._orders(keys=keys, args=argv)
        outcome = text(reply[0])
        if outcome == "UNKNOWN":
            raise UnknownOrder(order_id)
        return [outcome, *reply[1:]]

    async def create(
        self,
        account_id: str,
        pack: Pack,
        channel: str,
        device: str,
        *,
        idempotency_key: str = "",
        body_hash: str = "",
    ) -> tuple[dict[str, str], bool]:
        """Write a `created` order, or find the key's first one; (fields, replayed)."""
        moment = utc_now()
        expires = moment + dt.timedelta(minutes=self._minutes)
        fields: dict[str, str | int] = {
            "pack": pack.id, "yuan": pack.yuan, "fen": pack.fen,
            "credits": pack.credits, "bonus": pack.bonus,
            "channel": channel, "device": device,
            "created_at": iso(moment), "created": int(moment.timestamp()),
            "expires_at": iso(expires), "expires": int(expires.timestamp()),
        }  # fmt: skip
        flat_fields = [item for pair in fields.items() for item in pair]
        # The store's client retries a script whose reply it lost: the token
        # tells that retry its own order from another's with the same id.
        call = secrets.token_hex(8)
        while True:
            order_id = account_id + secrets.token_hex(4)
            reply = await self._run(
                order_id, "create", idempotency_key, body_hash, call, *flat_fields
            )
            if reply[0] != "TAKEN":  # 2^32 ids an account: a clash draws again
                break
        if reply[0] == "IDEMPOTENCY_KEY_REUSED":
            raise IdempotencyKeyReused(idempotency_key)
        if reply[0] == "NO_ACCOUNT":
            raise UnknownAccount(account_id)
        if reply[0] == "ACCOUNT_DELETING":
            raise AccountDeleting(account_id)
        order = pairs(reply[1])
        if order["status"] == "created":  # again on a replay: a crash in between
            await self._redis.zadd(OPEN, {order["id"]: int(order["created"])}, nx=True)
        return order, reply[0] == "REPLAY"

    async def get(self, order_id: str) -> dict[str, str] | None:
        """Return an order's fields, or None (also for a malformed id)."""
        if account_of(order_id) is None:
            return None
        found = await self._redis.hgetall(order_key(order_id))
        return {text(k): text(v) for k, v in found.items()} or None

    async def page(
        self, account_id: str, *, before: int | None, limit: int
    ) -> tuple[list[dict[str, str]], int | None]:
        """List orders newest first; the cursor is an order's sequence number."""
        top: int | str = f"({before}" if before is not None else "+inf"
        found: Sequence[tuple[bytes, float]] = await self._redis.zrevrangebyscore(  # type: ignore[assignment]
            f"{account_key(account_id)}:orders", top, "-inf",
            start=0, num=limit + 1, withscores=True,
        )  # fmt: skip
        rows = list(found[:limit])
        async with self._redis.pipeline(transaction=False) as pipe:
            for order_id, _ in rows:
                pipe.hgetall(order_key(text(order_id)))
            records = await pipe.execute()
        items = [{text(k): text(v) for k, v in r.items()} for r in records if r]
        more = len(found) > limit
        return items, int(rows[-1][1]) if more and rows else None

    async def pay(self, order_id: str, trade_no: str, paid_fen: int) -> bool:
        """Credit a paid order once: True now, False if it already was paid."""
        moment = utc_now()
        expires = add_months(moment, self._months)
        reply = await self._run(
            order_id, "pay", trade_no, paid_fen,
            int(moment.timestamp()), iso(moment),
            int(expires.timestamp()), iso(expires),
            durable=True,
        )  # fmt: skip
        if reply[0] == "MISMATCH":
            raise AmountMismatch(order_id)
        if reply[0] == "NO_ACCOUNT":  # purged: the money goes back by hand
            await self._redis.zrem(OPEN, order_id)
            raise UnknownAccount(order_id)
        if reply[0] == "PAID":
            await self._redis.zrem(OPEN, order_id)
            return True
        return False

    async def expire(self, order_id: str, now: float) -> bool:
        """Mark a `created` order past its expiry `expired`; True if it changed."""
        reply = await self._run(order_id, "expire", int(now))
        return bool(reply[0] == "EXPIRED")

    async def mark_asked(self, order_id: str, now: float, every: float = 5.0) -> bool:
        """Tell whether nobody asked the provider in the last `every` s; record now."""
        reply = await self._run(order_id, "asked", repr(now), repr(every))
        return bool(reply[0] == "OK")

    async def keep_action(self, order_id: str, action: Mapping[str, str]) -> None:
        """Keep the provider's action (a QR's code_url) so a page can show it again."""
        await self._run(order_id, "keep_action", json.dumps(action, sort_keys=True))

    async def _quote(
        self, order_id: str, now: float
    ) -> tuple[Refund, dict[str, str], int]:
        order = await self.get(order_id)
        if order is None:
            raise UnknownOrder(order_id)
        if order["refund_state"]:
            return _recorded(order), order, -1
        if order["status"] not in ("paid", "refunded"):
            raise NotRefundable("NOT_PAID")
        raw = await self._redis.hget(f"{account_key(order_id[:24])}:lot", order["lot"])
        if raw is None:  # the account was purged; its order is only a record now
            raise NotRefundable("ACCOUNT_GONE")
        lot = json.loads(raw)
        # the script sweeps before it compares: an expired lot holds nothing
        remaining = 0 if lot["expires"] <= now else int(lot["remaining"])
        credits, fen, fee_fen = policy_refund(
            float(order["paid"]), now, int(order["credits"]), int(lot["granted"]),
            remaining,
        )  # fmt: skip
        # money already refunded at the provider (a console refund) is never paid twice
        # (the lot-based count already leaves it out, but for a few fen: credits
        # are whole tenths of a yuan, money is not)
        fen = min(fen, int(order["fen"]) - int(order["covered_fen"]))
        if fen <= 0:
            raise NotRefundable("NOTHING_TO_REFUND")
        refund = Refund(order_id, refund_id_of(order_id), fen, fee_fen, credits, "")
        return refund, order, remaining

    async def quote(self, order_id: str, now: float) -> Refund:
        """Say what a policy refund would be now (or the one already begun)."""
        refund, _, _ = await self._quote(order_id, now)
        return refund

    async def begin_refund(self, order_id: str, now: float) -> Refund:
        """Take the order lot's remaining credits and record the refund, once.

        A later call returns the same refund untouched, so the operator can
        retry the provider call safely with the same refund id.
        """
        for _ in range(_REFUND_TRIES):
            refund, order, remaining = await self._quote(order_id, now)
            if refund.state:
                return refund
            moment = dt.datetime.fromtimestamp(int(now), dt.UTC)
            reply = await self._run(
                order_id, "begin_refund", int(now), iso(moment),
                remaining, order["covered_fen"], refund.credits, refund.fen,
                refund.fee_fen, refund.refund_id,
                durable=True,
            )  # fmt: skip
            if reply[0] == "NOT_PAID":
                raise NotRefundable("NOT_PAID")
            if reply[0] == "NO_ACCOUNT":
                raise NotRefundable("ACCOUNT_GONE")
            if reply[0] == "BEGUN":
                return _recorded(pairs(reply[1]))
        raise RuntimeError(f"the lot of {order_id} kept changing")

    async def own_refund(self, order_id: str) -> tuple[str, int] | None:
        """Our refund of the order, once begun: its refund id and its money (fen)."""
        refund_id, fen = await self._redis.hmget(
            order_key(order_id), ["refund_id", "refund_fen"]
        )
        if not refund_id or fen is None:
            return None
        return text(refund_id), int(fen)

    async def finish_refund(self, order_id: str) -> None:
        """Mark a begun refund done: the provider accepted it."""
        reply = await self._run(order_id, "finish_refund", durable=True)
        if reply[0] == "NONE":
            raise NotRefundable("NOTHING_TO_REFUND")

    async def provider_refunded(self, order_id: str, cumulative_fen: int) -> int:
        """Apply a provider's cumulative refunded amount; the credits it newly cost.

        Returns the credits taken plus those added to `owed` (0 for a repeat);
        raises NotRefundable("NOT_PAID") for an order that was never paid here.
        """
        moment = utc_now()
        reply = await self._run(
            order_id, "provider_refund", int(moment.timestamp()), iso(moment),
            cumulative_fen, durable=True,
        )  # fmt: skip
        if reply[0] == "NOT_PAID":
            raise NotRefundable("NOT_PAID")
        if reply[0] == "NO_ACCOUNT":  # purged: no credits left to take back
            return 0
        return int(reply[1])

    async def open_orders(self, *, older_than: float, limit: int = 100) -> list[str]:
        """List open orders created before `older_than`, oldest first."""
        found: Sequence[bytes] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            OPEN, "-inf", f"({older_than}", start=0, num=limit
        )
        return [text(member) for member in found]

    async def forget_open(self, order_id: str) -> None:
        """Stop the reconciler asking about an order."""
        await self._redis.zrem(OPEN, order_id)

    async def handled(self, provider: str, event_id: str) -> bool:
        """Tell whether a notice was handled successfully in the last 7 days."""
        return bool(await self._redis.exists(_event_key(provider, event_id)))

    async def record_notice(
        self,
        provider: str,
        event_id: str,
        order_id: str,
        *,
        verified: bool,
        outcome: str,
    ) -> None:
        """Audit a notice; remember it as handled when verified with outcome "ok"."""
        now = time.time()
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.xadd(
                NOTICES,
                {
                    "provider": provider, "event_id": event_id, "order_id": order_id,
                    "verified": "1" if verified else "0", "outcome": outcome,
                    "at": iso(dt.datetime.fromtimestamp(int(now), dt.UTC)),
                },
                minid=int((now - _WEEK) * 1000),
                approximate=True,
            )  # fmt: skip
            # Anyone can post forged notices: a week of them must not fill Redis.
            pipe.xtrim(NOTICES, maxlen=self.max_notices, approximate=False)
            await pipe.execute()
        if verified and outcome == "ok":
            await self._redis.set(
                _event_key(provider, event_id), "1", nx=True, ex=_WEEK
            )

    async def notices(self, count: int = 50) -> list[dict[str, str]]:
        """Return the newest audited notices first, each with its stream id."""
        found: Sequence[tuple[bytes, dict[bytes, bytes]]] = await self._redis.xrevrange(  # type: ignore[assignment]
            NOTICES, count=count
        )
        return [
            {"id": text(entry_id), **{text(k): text(v) for k, v in fields.items()}}
            for entry_id, fields in found
        ]


def _event_key(provider: str, event_id: str) -> str:
    return f"studio:payevt:{provider}:{event_id}"
