"""Accounts in Redis: opened once per address, with the trial credits granted once."""

from __future__ import annotations

import datetime as dt
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import Redis

# Creates the account only if its key is absent; returns whether it did, and the record.
_OPEN: Final = """
local created = 0
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('HSET', KEYS[1], 'id', ARGV[1], 'email', ARGV[2],
             'credits', ARGV[3], 'created_at', ARGV[4])
  created = 1
end
return {created, redis.call('HGETALL', KEYS[1])}
"""


@dataclass(frozen=True, slots=True)
class Account:
    """What the workbench shows of a person."""

    id: str
    email: str
    credits: int
    created_at: str
    key: str

    def public(self) -> dict[str, Any]:
        """Return the fields the API answers with."""
        return {
            "id": self.id,
            "email": self.email,
            "credits": self.credits,
            "created_at": self.created_at,
        }


def account_key(address_key: str) -> str:
    """Name the account's hash; the address HMAC is its Cluster hash tag."""
    return f"studio:user:{{{address_key}}}"


def _account(fields: Mapping[Any, Any], key: str) -> Account:
    values = {_text(k): _text(v) for k, v in fields.items()}
    return Account(
        id=values["id"],
        email=values["email"],
        credits=int(values["credits"]),
        created_at=values["created_at"],
        key=key,
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class AccountStore:
    """Open and read accounts; the opening script is loaded once."""

    def __init__(self, redis: Redis, trial_credits: int) -> None:
        self._redis = redis
        self._trial_credits = trial_credits
        self._open = redis.register_script(_OPEN)

    async def open(self, address_key: str, email: str) -> tuple[Account, bool]:
        """Find the account of an address or open it; only the opener grants credits."""
        now = (
            dt.datetime.now(dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
        )
        key = account_key(address_key)
        args: list[str | int] = [secrets.token_hex(12), email, self._trial_credits, now]
        created, flat = await self._open(keys=[key], args=args)
        fields = dict(zip(flat[::2], flat[1::2], strict=True))
        return _account(fields, address_key), bool(created)

    async def load(self, address_key: str) -> Account | None:
        """Return the account filed under an address key, if there is one."""
        fields = await self._redis.hgetall(account_key(address_key))
        return _account(fields, address_key) if fields else None
