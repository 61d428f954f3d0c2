"""Accounts: a random id each, found by the address's HMAC, opened once with a trial."""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from ..studio.ledger import Ledger, account_key, text


@dataclass(frozen=True, slots=True)
class Account:
    """What the workbench shows of a person."""

    id: str
    email: str
    credits: int
    created_at: str

    def public(self) -> dict[str, Any]:
        """Return the fields the API answers with."""
        return {
            "id": self.id,
            "email": self.email,
            "credits": self.credits,
            "created_at": self.created_at,
        }


def address_index_key(address_key: str) -> str:
    """Name the key that maps an address HMAC to its account id (its own slot)."""
    return f"studio:email:{{{address_key}}}"


def _account(fields: Mapping[str, str]) -> Account:
    return Account(
        id=fields["id"],
        email=fields["email"],
        credits=int(fields["balance"]),
        created_at=fields["created_at"],
    )


class AccountStore:
    """Open and read accounts.

    The address index and the account live in different slots, so opening is
    two idempotent steps: claim an id for the address (SET NX), then create the
    account under that id with its trial grant (a script that does nothing if
    the account exists). A crash between them leaves an id that the next
    sign-in completes; concurrent first sign-ins agree on one id and one grant.
    """

    def __init__(self, redis: Redis, ledger: Ledger) -> None:
        self._redis = redis
        self._ledger = ledger

    async def open(self, address_key: str, email: str) -> tuple[Account, bool]:
        """Find the account of an address or open it; only the opener grants credits."""
        index = address_index_key(address_key)
        claimed = secrets.token_hex(12)
        await self._redis.set(index, claimed, nx=True)
        found = await self._redis.get(index)
        account_id = found.decode() if isinstance(found, bytes) else str(found)
        fields, created = await self._ledger.open(account_id, email, address_key)
        return _account(fields), created

    async def load(self, account_id: str) -> Account | None:
        """Return the account with this id, if there is one."""
        fields = await self._redis.hgetall(account_key(account_id))
        return (
            _account({text(k): text(v) for k, v in fields.items()}) if fields else None
        )

    async def find(self, address_key: str) -> str | None:
        """Return the id of the account of an address, if it has one."""
        found = await self._redis.get(address_index_key(address_key))
        return found.decode() if isinstance(found, bytes) else found
