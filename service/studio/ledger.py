"""The credits ledger: every change of a balance is one atomic script on one slot."""

from __future__ import annotations

import calendar
import datetime as dt
import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.commands.core import AsyncScript

from ..store.durable import DurableScripts

_LUA: Final = Path(__file__).parent / "lua"
_PRELUDE: Final = (_LUA / "ledger.lua").read_text()
# The most credits one operator grant or take-back moves (ten million yuan's
# worth): far beyond any real one, and every sum stays an exact integer.
MAX_ADJUST: Final = 100_000_000


def account_key(account_id: str) -> str:
    """Name an account's hash; its id is the hash tag of everything it owns."""
    return f"studio:acct:{{{account_id}}}"


def call_key(account_id: str) -> str:
    """Name a key in an account's slot for one call's reply, kept for its retry
    (the store's client retries a call whose reply was lost; Redis may have
    run it)."""
    return f"{account_key(account_id)}:call:{secrets.token_hex(8)}"


def events_channel(account_id: str) -> str:
    """Name the pub/sub channel of an account's live events."""
    return f"studio:events:{account_id}"


def script(
    redis: Redis, name: str, directory: Path = _LUA, uses: Sequence[str] = ()
) -> AsyncScript:
    """Register an account script: the shared prelude, the parts it uses, its body."""
    parts = [_PRELUDE, *((_LUA / f"{part}.lua").read_text() for part in uses)]
    parts.append((directory / f"{name}.lua").read_text())
    return redis.register_script("".join(parts))


def text(value: bytes | str) -> str:
    """Decode a Redis reply item."""
    return value.decode() if isinstance(value, bytes) else value


def pairs(flat: Sequence[Any]) -> dict[str, str]:
    """Turn a flat HGETALL-style reply into a dict of strings."""
    return {text(k): text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}


def iso(moment: dt.datetime) -> str:
    """Write a time as RFC 3339 UTC with a Z."""
    return (
        moment.astimezone(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    )


def now() -> dt.datetime:
    """Return the current time in UTC, to the second."""
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def add_months(moment: dt.datetime, months: int) -> dt.datetime:
    """Move a time by whole calendar months, clamping the day (Jan 31 + 1 = Feb 28)."""
    month0 = moment.month - 1 + months
    year, month = moment.year + month0 // 12, month0 % 12 + 1
    day = min(moment.day, calendar.monthrange(year, month)[1])
    return moment.replace(year=year, month=month, day=day)


class InsufficientCredits(Exception):
    """The balance does not cover what was asked."""

    def __init__(self, balance: int) -> None:
        super().__init__(balance)
        self.balance = balance


class UnknownAccount(Exception):
    """No account has that id."""


class AccountDeleting(Exception):
    """The account is being deleted: it takes no new generations, orders or exports."""


@dataclass(frozen=True, slots=True)
class CreditsPage:
    """One page of the ledger, newest first, with the balance and live lots."""

    balance: int
    owed: int
    lots: list[dict[str, Any]]
    entries: list[dict[str, Any]]
    next_before: int | None


def _lot_view(lot_id: str, lot: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": lot_id,
        "kind": lot["kind"],
        "granted": lot["granted"],
        "remaining": lot["remaining"],
        "expires_at": lot["expires_at"],
        "order_id": lot.get("order_id"),
    }


class Ledger:
    """Open accounts with their trial lot, grant and take credits, read the ledger."""

    def __init__(
        self,
        redis: Redis,
        *,
        trial_credits: int,
        expire_months: int,
        wait_replicas: int = 0,
    ) -> None:
        self._redis = redis
        self._durable = DurableScripts(redis, wait_replicas)
        self._trial = trial_credits
        self._months = expire_months
        self._open = script(redis, "open")
        self._adjust = script(redis, "adjust")

    def _expiry(self, moment: dt.datetime) -> list[str | int]:
        expires = add_months(moment, self._months)
        return [int(expires.timestamp()), iso(expires)]

    async def open(
        self, account_id: str, email: str, address: str, *, trial: bool = True
    ) -> tuple[dict[str, str], bool]:
        """Create the account (with its trial grant, if it earns one) once.

        Returns the account and whether it is new; an address that had an
        account before earns no second trial (`trial=False`).
        """
        moment = now()
        args: list[str | int] = [account_id, email, address, iso(moment)]
        args.append(self._trial if trial else 0)
        created, flat = await self._durable.run(
            self._open, [account_key(account_id)], args + self._expiry(moment)
        )
        return pairs(flat), bool(created)

    async def adjust(self, account_id: str, amount: int, note: str) -> int:
        """Grant (a bonus lot) or take back credits as `adjust`; the new balance."""
        if not 0 < abs(amount) <= MAX_ADJUST:
            raise ValueError(f"the amount must be 1 to {MAX_ADJUST} either way")
        moment = now()
        args: list[str | int] = [amount, note, int(moment.timestamp()), iso(moment)]
        reply = await self._durable.run(
            self._adjust,
            [account_key(account_id)],
            # The operation's id: a retry after a lost reply grants nothing twice.
            [*args, *self._expiry(moment), MAX_ADJUST, secrets.token_hex(8)],
        )
        outcome = text(reply[0])
        if outcome == "BAD_AMOUNT":
            raise ValueError(f"the amount must be 1 to {MAX_ADJUST} either way")
        if outcome == "NO_ACCOUNT":
            raise UnknownAccount(account_id)
        if outcome == "INSUFFICIENT_CREDITS":
            raise InsufficientCredits(int(reply[1]))
        return int(reply[1])

    async def page(
        self, account_id: str, *, before: int | None, limit: int
    ) -> CreditsPage:
        """Read the balance, the lots with credits left and a page of entries.

        Entries are append-only, so the entry with sequence number n sits at
        index n - 1 of the list forever: a cursor is a sequence number.
        """
        key = account_key(account_id)
        if before is None:
            start, stop = -(limit + 1), -1
        elif before > 1:
            start, stop = max(0, before - 2 - limit), before - 2
        else:
            start, stop = 1, 0  # an empty range: nothing comes before the first
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hmget(key, ["balance", "owed"])
            pipe.zrange(f"{key}:lots", 0, -1)
            pipe.hgetall(f"{key}:lot")
            pipe.lrange(f"{key}:ledger", start, stop)
            numbers, order, lots, raw = await pipe.execute()
        all_lots = {text(k): json.loads(v) for k, v in lots.items()}
        live = [
            _lot_view(lot_id, all_lots[lot_id])
            for lot_id in map(text, order)
            if all_lots[lot_id]["remaining"] > 0
        ]
        rows = [json.loads(item) for item in raw]
        more = len(rows) > limit
        rows = rows[-limit:] if more else rows
        entries = list(reversed(rows))
        next_before = int(entries[-1]["id"][1:]) if more and entries else None
        balance, owed = (int(n or 0) for n in numbers)
        return CreditsPage(balance, owed, live, entries, next_before)
