"""Accounts: a random id each, found by the address's HMAC, opened once with a trial."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import Redis

from ..studio.ledger import Ledger, account_key, text
from ..studio.queue import new_account_id
from .identity import Keyring

# How long an address's entry under a retired name outlives its new filing.
INDEX_GRACE_SECONDS: Final = 30 * 86400
# How long the keyed hash of an address that had an account is kept (no second
# trial grant), and so how long a deleted account's orders stay: three years.
KEPT_SECONDS: Final = 3 * 365 * 86400
# Forget an address's filing only if it still names the account being let go.
_DETACH: Final = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(frozen=True, slots=True)
class Account:
    """What the workbench shows of a person."""

    id: str
    email: str
    credits: int
    created_at: str
    # Credits a refund made at a provider took back beyond the balance (CONTRACT §8).
    credits_owed: int = 0

    def public(self) -> dict[str, Any]:
        """Return the fields the API answers with."""
        return {
            "id": self.id,
            "email": self.email,
            "credits": self.credits,
            "credits_owed": self.credits_owed,
            "created_at": self.created_at,
        }


def address_index_key(address_key: str, key_id: str) -> str:
    """Name the key that maps an address HMAC to its account id (its own slot).

    The key id names the secret the HMAC was made with, so the entries of a
    retired key can be told apart (and counted) after a rotation.
    """
    return f"studio:email:{key_id}:{{{address_key}}}"


def legacy_index_key(address_key: str) -> str:
    """Name an address's index entry as it was filed before keys had ids."""
    return f"studio:email:{{{address_key}}}"


def trial_key(address_key: str) -> str:
    """Name the mark that an address earned its trial credits (its HMAC's slot)."""
    return f"studio:trial:{{{address_key}}}"


def _account(fields: Mapping[str, str]) -> Account:
    return Account(
        id=fields["id"],
        email=fields["email"],
        credits=int(fields["balance"]),
        created_at=fields["created_at"],
        credits_owed=int(fields.get("owed") or 0),
    )


class AccountStore:
    """Open and read accounts, found by their address under the current or previous key.

    The address index and the account live in different slots, so opening is
    two idempotent steps: claim an id for the address (SET NX), then create the
    account under that id with its trial grant (a script that does nothing if
    the account exists). A crash between them leaves an id that the next
    sign-in completes; concurrent first sign-ins agree on one id and one grant.

    An address found only under the previous key (or under a name from before
    key ids) is filed again under the current key with the same SET NX; the
    old entry is left to expire after INDEX_GRACE_SECONDS, so processes still
    running with the old key find the account meanwhile.
    """

    def __init__(self, redis: Redis, ledger: Ledger, keyring: Keyring) -> None:
        self._redis = redis
        self._ledger = ledger
        self._keyring = keyring
        self._detach = redis.register_script(_DETACH)

    def _names(self, email: str) -> list[tuple[str, str]]:
        """Return (index key, address HMAC) to look under, the current name first."""
        names = []
        for kid, key in self._keyring.filings(email):
            names += [(address_index_key(key, kid), key), (legacy_index_key(key), key)]
        return names

    async def open(self, email: str) -> tuple[Account, bool]:
        """Find the account of an address or open it; only the opener grants credits.

        An address whose earlier account was deleted opens a new one without
        trial credits: the keyed hash of the address outlives the account.
        """
        (current, address_key), *_ = self._names(email)
        account_id = await self.find(email)
        trial = True
        if account_id is None:
            trial = not await self.had_trial(email)
            await self._redis.set(current, new_account_id(), nx=True)
            account_id = text(await self._redis.get(current) or b"")
        fields, created = await self._ledger.open(
            account_id, email, address_key, trial=trial
        )
        if created:
            await self.mark_trial(email)
        return _account(fields), created

    def address_keys(self, email: str, *also: str) -> list[str]:
        """Return the address's HMAC under each key, the current one first, then
        any other HMAC of it given (an account's stored one), each once."""
        keys = [key for _, key in self._keyring.filings(email)]
        return list(dict.fromkeys([*keys, *filter(None, also)]))

    async def had_trial(self, email: str) -> bool:
        """Tell whether the address earned trial credits before (any key's HMAC)."""
        keys = [trial_key(key) for _, key in self._keyring.filings(email)]
        return bool(await self._redis.exists(*keys))

    async def mark_trial(self, email: str, *also: str) -> None:
        """Keep the keyed hash of the address (and older HMACs of it) three years."""
        (_, address_key), *_ = self._keyring.filings(email)
        for key in dict.fromkeys((address_key, *also)):
            await self._redis.set(trial_key(key), "1", ex=KEPT_SECONDS)

    async def detach(self, email: str, account_id: str) -> None:
        """Forget every filing of the address that still names this account."""
        for name, _ in self._names(email):
            await self._detach(keys=[name], args=[account_id])

    async def load(self, account_id: str) -> Account | None:
        """Return the account with this id, if there is one."""
        fields = await self._redis.hgetall(account_key(account_id))
        return (
            _account({text(k): text(v) for k, v in fields.items()}) if fields else None
        )

    async def find(self, email: str) -> str | None:
        """Return the id of the account of an address, filing it anew if need be."""
        (current, _), *older = self._names(email)
        if (found := await self._redis.get(current)) is not None:
            return text(found)
        for name, _ in older:
            if (found := await self._redis.get(name)) is not None:
                return await self._refile(current, name, text(found))
        return None

    async def refile_all(self) -> tuple[int, int, int]:
        """File every account's address under the current key: filed, kept, clashes.

        Run after a rotation, so that STUDIO_SECRET_KEY_PREVIOUS can go without
        orphaning accounts whose owners have not signed in since. An address
        already filed under another account (opened while neither key matched)
        is left as it is and counted as a clash.
        """
        filed = kept = clashes = 0
        async for name in self._redis.scan_iter(match="studio:acct:{*}", count=500):
            account_id = text(name).removeprefix("studio:acct:{").removesuffix("}")
            email = await self._redis.hget(name, "email")
            if not email:
                continue  # not an account hash, or its address was erased
            (current, _), *_ = self._names(text(email))
            if await self._redis.set(current, account_id, nx=True):
                filed += 1
            elif text(await self._redis.get(current) or b"") == account_id:
                kept += 1
            else:
                clashes += 1
        return filed, kept, clashes

    async def _refile(self, current: str, old: str, account_id: str) -> str:
        """File an account found under an old name under the current one."""
        await self._redis.set(current, account_id, nx=True)
        winner = text(await self._redis.get(current) or b"")
        if winner == account_id:
            await self._redis.expire(old, INDEX_GRACE_SECONDS)
        return winner
