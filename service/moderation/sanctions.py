"""Suspending an account and restoring it (CONTRACT §11), each one log record.

A suspension marks the account first (suspension.py: no session opens from
then on), then ends every session, cancels and refunds its queued and running
generations (the same step as deleting an account: account/deletion.py) and
unpublishes its works, so they leave the square and stay off it after a
restore until their author publishes them again. The address is marked too
(suspension.py), so the suspension outlives a deletion of the account.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from ..account.deletion import DeletionStore
from ..auth.sessions import SessionStore
from ..square.feed import SquareStore
from ..studio.ledger import account_key, iso, now, text
from ..studio.works import WorkNotFound, WorkStore
from .log import ModerationLog, Record
from .suspension import (
    lift_addresses,
    suspend_addresses,
    suspension_key,
)


@dataclass(frozen=True, slots=True)
class Suspended:
    """What a suspension did."""

    until: str | None
    sessions: int
    generations: int
    works: int


class Sanctions:
    """Suspend and restore accounts through the stores the account concern uses."""

    def __init__(
        self, redis: Redis, deletions: DeletionStore, log: ModerationLog
    ) -> None:
        self._redis = redis
        self._deletions = deletions
        self._sessions = SessionStore(redis)
        self._works = WorkStore(redis, SquareStore(redis))
        self._log = log

    async def suspend(
        self, account_id: str, reason: str, days: int | None, *, source: str
    ) -> Suspended:
        """Mark the account, then end its sessions, generations and square presence.

        Suspending again replaces the end date and repeats the rest.
        """
        moment = now()
        until = iso(moment + dt.timedelta(days=days)) if days else None
        key = suspension_key(account_id)
        mark: dict[FieldT, EncodableT] = {"at": iso(moment), "reason": reason}
        if until:
            mark["until"] = until
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping=mark)
            if days:
                pipe.expire(key, days * 86400)
            await pipe.execute()
        await suspend_addresses(
            self._redis,
            await self._address_keys(account_id),
            account_id,
            until,
            days * 86400 if days else None,
        )
        done = Suspended(
            until=until,
            sessions=await self._sessions.end_all(account_id),
            generations=await self._deletions.cancel_generations(account_id),
            works=await self._unpublish(account_id),
        )
        await self._log.append(
            Record(
                source=source,
                verdict="suspended",
                account=account_id,
                note=reason,
                rule=f"until {until}" if until else "indefinitely",
            )
        )
        return done

    async def _unpublish(self, account_id: str) -> int:
        """Unpublish every published work of the account; count them."""
        found: list[bytes] = await self._redis.zrange(  # type: ignore[assignment]
            f"{account_key(account_id)}:works", 0, -1
        )
        unpublished = 0
        for wid in map(text, found):
            owned = await self._works.owned(account_id, wid)
            if owned is None or not owned.record.get("published_at"):
                continue
            try:
                await self._works.unpublish(account_id, wid)
            except WorkNotFound:  # deleted meanwhile
                continue
            unpublished += 1
        return unpublished

    async def _address_keys(self, account_id: str) -> list[str]:
        """Return every keyed hash of the account's address: each key's, and its own."""
        email, address = await self._redis.hmget(
            account_key(account_id), ["email", "address"]
        )
        if email is None:
            return []
        return self._deletions.accounts.address_keys(text(email), text(address or ""))

    async def restore(self, account_id: str, note: str = "") -> bool:
        """Lift a suspension; False if the account was not suspended."""
        lifted = bool(await self._redis.delete(suspension_key(account_id)))
        lifted |= bool(
            await lift_addresses(self._redis, await self._address_keys(account_id))
        )
        if not lifted:
            return False
        await self._log.append(
            Record(source="operator", verdict="restored", account=account_id, note=note)
        )
        return True

    async def restore_address(self, email: str, note: str = "") -> list[str]:
        """Lift the suspension an address kept after its account was deleted;
        return the accounts it named (none: the address was not suspended)."""
        keys = self._deletions.accounts.address_keys(email)
        accounts = await lift_addresses(self._redis, keys)
        for account_id in dict.fromkeys(accounts):
            await self._log.append(
                Record(
                    source="operator",
                    verdict="restored",
                    account=account_id,
                    note=note or "the account was deleted: its address may sign in",
                )
            )
        return accounts
