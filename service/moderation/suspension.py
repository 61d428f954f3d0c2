"""Whether an account is suspended: read where a session opens, so no way in remains.

A suspension is one hash in the account's slot (`studio:acct:{id}:suspended`:
until, reason, at); a suspension for N days expires with it, so it lapses by
itself. Opening a session (service/auth/sessions.py) reads it after writing
the session and undoes the session if it is there: whichever of a sign-in and
a suspension comes first, no session of a suspended account survives (the
suspension ends every session it finds after writing this mark).

The same mark is kept under the keyed hash of the account's address
(`studio:suspended:{hmac}`: until, account), for as long as the suspension
lasts and at most as long as that hash is kept after a deletion: a suspended
person who deletes the account, or whose deletion was asked before, cannot
come back under the same address with a new one. Sign-in reads it before
anything else, so a refused sign-in does not undo a pending deletion either.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from redis.asyncio import Redis

# How long an address keeps a suspension that has no end: as long as the keyed
# hash of a deleted account's address is kept (auth/accounts.py KEPT_SECONDS,
# a layer above this one; a test holds them equal).
ADDRESS_KEPT_SECONDS: Final = 3 * 365 * 86400


class AccountSuspended(Exception):
    """The account is suspended until `until` (an RFC 3339 time), or for good (None)."""

    def __init__(self, until: str | None) -> None:
        super().__init__("ACCOUNT_SUSPENDED")
        self.until = until


def suspension_key(account_id: str) -> str:
    """Name the mark of a suspended account, under the account's hash tag."""
    return f"studio:acct:{{{account_id}}}:suspended"


async def refuse_if_suspended(redis: Redis, account_id: str) -> None:
    """Raise AccountSuspended if the account is suspended now."""
    at, until = await redis.hmget(suspension_key(account_id), ["at", "until"])
    if at is not None:
        raise AccountSuspended(until.decode() if isinstance(until, bytes) else until)


def address_suspension_key(address_key: str) -> str:
    """Name the mark that keeps a suspended address out, under its HMAC's slot."""
    return f"studio:suspended:{{{address_key}}}"


async def suspend_addresses(
    redis: Redis,
    address_keys: Iterable[str],
    account_id: str,
    until: str | None,
    seconds: int | None,
) -> None:
    """Mark each keyed hash of an address for as long as its account's suspension."""
    for address_key in dict.fromkeys(address_keys):
        key = address_suspension_key(address_key)
        async with redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"until": until or "", "account": account_id})
            pipe.expire(key, seconds or ADDRESS_KEPT_SECONDS)
            await pipe.execute()


async def refuse_if_address_suspended(
    redis: Redis, address_keys: Sequence[str]
) -> None:
    """Raise AccountSuspended if any keyed hash of the address is marked."""
    for address_key in address_keys:
        until = await redis.hget(address_suspension_key(address_key), "until")
        if until is not None:
            text = until.decode() if isinstance(until, bytes) else str(until)
            raise AccountSuspended(text or None)


async def lift_addresses(redis: Redis, address_keys: Iterable[str]) -> list[str]:
    """Remove the marks of an address; return the accounts they named."""
    accounts = []
    for address_key in dict.fromkeys(address_keys):
        key = address_suspension_key(address_key)
        async with redis.pipeline(transaction=True) as pipe:
            pipe.hget(key, "account")
            pipe.delete(key)
            account, _ = await pipe.execute()
        if account is not None:
            accounts.append(account.decode() if isinstance(account, bytes) else account)
    return accounts
