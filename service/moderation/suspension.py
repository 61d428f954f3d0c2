"""Whether an account is suspended: read where a session opens, so no way in remains.

A suspension is one hash in the account's slot (`studio:acct:{id}:suspended`:
until, reason, at); a suspension for N days expires with it, so it lapses by
itself. Opening a session (service/auth/sessions.py) reads it after writing
the session and undoes the session if it is there: whichever of a sign-in and
a suspension comes first, no session of a suspended account survives (the
suspension ends every session it finds after writing this mark).
"""

from __future__ import annotations

from redis.asyncio import Redis


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
