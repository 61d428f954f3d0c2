"""Sign-in's keys: codes, devices, accounts, and who a returning address may be.

The session's own keys (SESSION, SESSIONS) live in sessions.py beside the
session layer that reads them, and the mailer's in mailer.py beside its context.
"""

from __future__ import annotations

from typing import Final, Protocol

from aiohttp import web

from .accounts import AccountStore
from .codes import CodeStore
from .devices import DeviceStore


class Returning(Protocol):
    """What sign-in asks before it opens an account: is this one coming back?"""

    async def on_sign_in(self, email: str) -> bool:
        """Restore the address's account if it is being deleted; say if it was."""


CODES: Final = web.AppKey("codes", CodeStore)
DEVICES: Final = web.AppKey("devices", DeviceStore)
ACCOUNTS: Final = web.AppKey("accounts", AccountStore)
# Accounts being deleted (the account concern's deletions), asked at each sign-in.
RETURNING: Final = web.AppKey("returning", Returning)
