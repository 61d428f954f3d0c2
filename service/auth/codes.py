"""One-time e-mail codes: one live per address and binding, HMAC at rest."""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import time
from enum import StrEnum
from typing import Final

from redis.asyncio import Redis

CODE_DIGITS: Final = 8
CODE_TTL_SECONDS: Final = 600
MAX_ATTEMPTS: Final = 5
_SEPARATORS: Final = re.compile(r"[\s\-]+")

# Count the attempt before comparing; consume the code once; burn it on the last try.
_VERIFY: Final = """
-- KEYS[2] is the call's own key: a retry of a call whose reply was lost (Redis
-- may have run it) answers what the first try did, and spends no attempt.
local done = redis.call('GET', KEYS[2])
if done then return done end
local h = redis.call('HGET', KEYS[1], 'h')
if not h then return 'NO_CODE' end
local n = redis.call('HINCRBY', KEYS[1], 'a', 1)
local reply = 'BAD'
if h == ARGV[1] and n <= tonumber(ARGV[2]) then
  reply = 'OK'
elseif n >= tonumber(ARGV[2]) then
  reply = 'BURNED'
end
if reply ~= 'BAD' then redis.call('DEL', KEYS[1]) end
redis.call('SET', KEYS[2], reply, 'EX', 60)
return reply
"""
# Withdraw a code only if it is still ours (a newer one may have replaced it).
_WITHDRAW: Final = """
if redis.call('HGET', KEYS[1], 'h') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class Verdict(StrEnum):
    """How a submitted code fared."""

    OK = "OK"
    BAD = "BAD"
    BURNED = "BURNED"
    NO_CODE = "NO_CODE"


def code_key(address_key: str, binding: str) -> str:
    """Name one binding's code; the address HMAC is the Cluster hash tag.

    The binding (the `studio_signin` cookie) appears only as its SHA-256, so
    the key names no cookie a reader of Redis could replay.
    """
    digest = hashlib.sha256(binding.encode()).hexdigest()[:32]
    return f"studio:code:{{{address_key}}}:{digest}"


def new_code() -> str:
    """Draw 8 digits from the OS's CSPRNG."""
    return f"{secrets.randbelow(10**CODE_DIGITS):0{CODE_DIGITS}d}"


def readable(code: str) -> str:
    """Show a code the way people read it: 1234 5678."""
    return f"{code[:4]} {code[4:]}"


def _digest(secret_key: str, address_key: str, code: str) -> str:
    message = f"code:{address_key}:{code}".encode()
    return hmac.new(secret_key.encode(), message, hashlib.sha256).hexdigest()


class CodeStore:
    """Issue and check codes; the scripts are loaded once and run by SHA."""

    def __init__(self, redis: Redis, secret_key: str) -> None:
        self._redis = redis
        self._secret_key = secret_key
        self._verify = redis.register_script(_VERIFY)
        self._withdraw = redis.register_script(_WITHDRAW)

    async def issue(self, address_key: str, binding: str) -> tuple[str, str]:
        """Store a fresh code's HMAC, replacing this binding's live one only."""
        code = new_code()
        digest = _digest(self._secret_key, address_key, code)
        key = code_key(address_key, binding)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(key)
            pipe.hset(key, mapping={"h": digest, "a": 0, "t": int(time.time())})
            pipe.expire(key, CODE_TTL_SECONDS)
            await pipe.execute()
        return code, digest

    async def withdraw(self, address_key: str, binding: str, digest: str) -> None:
        """Remove a code that could not be delivered, unless a newer one replaced it."""
        await self._withdraw(keys=[code_key(address_key, binding)], args=[digest])

    async def verify(self, address_key: str, binding: str, submitted: str) -> Verdict:
        """Spend one attempt on this binding's code for the address; say how it went."""
        normalised = _SEPARATORS.sub("", submitted)
        digest = _digest(self._secret_key, address_key, normalised)
        reply = await self._verify(
            keys=[
                code_key(address_key, binding),
                f"studio:codecall:{{{address_key}}}:{secrets.token_hex(8)}",
            ],
            args=[digest, MAX_ATTEMPTS],
        )
        return Verdict(reply.decode() if isinstance(reply, bytes) else reply)
