"""Deleting an account: at once (sessions, square, generations), restored, purged.

`delete` marks the account (`deleting` = purge_at in its hash, and a member of
PURGE_QUEUE scored by it), then ends its sessions, cancels its queued and
running generations (refunded, the worker stops them) and takes its works
off the square, remembering which were listed. Signing in before purge_at
restores it whole. The purge (a worker's task, `purger.py`) removes everything
of the account except its orders, their ledger entries and the keyed hash of
its address, which stay three years.

Every step is idempotent and the account hash goes last, so a purge cut short
(a killed worker) finishes on the next pass, and two workers purging the same
account at once do the same things twice, harmlessly. Who wins between a
restore and a purge is decided by one script on the account's slot: once the
purge began (`purging`), no restore succeeds.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final, cast

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from ..auth.accounts import KEPT_SECONDS, AccountStore
from ..auth.identity import Keyring
from ..auth.sessions import SessionStore
from ..moderation.suspension import suspend_addresses, suspension_key
from ..settings import Settings
from ..square.feed import SquareStore
from ..store.connect import is_cluster
from ..studio.generations import GenerationStore
from ..studio.ledger import Ledger, UnknownAccount, account_key, text
from ..studio.media.store import MediaStore
from ..studio.queue import JobQueue, prefix, shard_of, shard_ref
from ..studio.works import HIDDEN, WorkNotFound, WorkStore
from .exports import QUEUE as EXPORT_QUEUE

_LOGGER: Final = logging.getLogger(__name__)
_SCRIPT: Final = (Path(__file__).parent / "lua" / "deletion.lua").read_text()
# Accounts waiting for their purge: member the account id, score purge_at (epoch).
PURGE_QUEUE: Final = "studio:accounts:purge"
_SCAN_COUNT: Final = 1000
# Other keys of a purged account that carry its id or address: its rate-limit
# buckets (limits/limiter.py bucket_key) and its live codes (auth/codes.py).
_BUCKETS: Final = "studio:rl:v1:{{{subject}}}:*"
_CODES: Final = "studio:code:{{{address}}}:*"


class Restore(StrEnum):
    """What a sign-in found: a live account, one restored, or one past its purge_at."""

    LIVE = "LIVE"
    RESTORED = "RESTORED"
    EXPIRED = "EXPIRED"


@dataclass(frozen=True, slots=True)
class Deleted:
    """An account marked for deletion: when it will be purged."""

    account_id: str
    purge_at: int


def unlisted_key(account_id: str) -> str:
    """Name the set of works a deletion took off the square (a restore relists them)."""
    return f"{account_key(account_id)}:unlisted"


def _kept(name: str, account: str) -> bool:
    """Tell whether an account's key outlives its purge (orders and their entries)."""
    rest = name.removeprefix(account)
    return rest in (":orders", ":ledger") or rest.startswith(":order:")


async def slot_keys(redis: Redis, tagged: str, match: str) -> AsyncIterator[str]:
    """SCAN for keys matching `match` on the node that holds `tagged`'s slot.

    On Redis Cluster every key of one hash tag lives on one node: only that
    node is scanned. Never KEYS: SCAN walks the keyspace without blocking it.
    """
    options: dict[str, Any] = {}
    if is_cluster(redis):
        options["target_nodes"] = cast(RedisCluster, redis).get_node_from_key(tagged)
    found = redis.scan_iter(match=match, count=_SCAN_COUNT, **options)
    async for name in found:
        yield text(name)


async def _members(redis: Redis, key: str, start: int = 0, stop: int = -1) -> list[str]:
    """Return a range of a sorted set's members as text."""
    found: list[bytes] = await redis.zrange(key, start, stop)  # type: ignore[assignment]
    return [text(member) for member in found]


class DeletionStore:
    """Delete an account now, restore it within its grace period, purge it after."""

    def __init__(
        self,
        redis: Redis,
        *,
        accounts: AccountStore,
        sessions: SessionStore,
        generations: GenerationStore,
        jobs: JobQueue,
        works: WorkStore,
        square: SquareStore,
        media: MediaStore,
        grace_seconds: int,
    ) -> None:
        self._redis = redis
        self._accounts = accounts
        self._sessions = sessions
        self._generations = generations
        self._jobs = jobs
        self._works = works
        self._square = square
        self._media = media
        self.grace_seconds = grace_seconds
        self._script = redis.register_script(_SCRIPT)

    @classmethod
    def build(
        cls, redis: Redis, settings: Settings, media: MediaStore
    ) -> DeletionStore:
        """Build the store and everything it acts through (a worker, an operator)."""
        ledger = Ledger(
            redis,
            trial_credits=settings.trial_credits,
            expire_months=settings.workbench.expire_months,
            wait_replicas=settings.redis_wait_replicas,
        )
        keyring = Keyring(settings.secret_key, settings.secret_key_previous)
        square = SquareStore(redis)
        return cls(
            redis,
            accounts=AccountStore(redis, ledger, keyring),
            sessions=SessionStore(redis),
            generations=GenerationStore(redis, settings.redis_wait_replicas),
            jobs=JobQueue(redis),
            works=WorkStore(redis, square),
            square=square,
            media=media,
            grace_seconds=settings.account.grace_days * 86400,
        )

    @property
    def media(self) -> MediaStore:
        """The media store it deletes works' files from."""
        return self._media

    @property
    def accounts(self) -> AccountStore:
        """Return the account store addresses are resolved through."""
        return self._accounts

    async def _run(self, account_id: str, *args: str | int) -> list[Any]:
        reply = await self._script(keys=[account_key(account_id)], args=list(args))
        return [text(item) if isinstance(item, bytes) else item for item in reply]

    async def delete(self, account_id: str, purge_at: int | None = None) -> Deleted:
        """Mark the account, then end its sessions, generations and square presence.

        Deleting again keeps the first purge_at and repeats the rest (a
        deletion cut short is finished by asking again).
        """
        at = int(time.time()) + self.grace_seconds if purge_at is None else purge_at
        reply = await self._run(account_id, "mark", at)
        if reply[0] == "NO_ACCOUNT":
            raise UnknownAccount(account_id)
        at, email, address = int(reply[1]), reply[2], reply[3]
        await self._redis.zadd(PURGE_QUEUE, {account_id: at})
        # A new sign-in with the address, even before the purge, earns no trial.
        await self._accounts.mark_trial(email, *([address] if address else []))
        ended = await self._sessions.end_all(account_id)
        canceled = await self.cancel_generations(account_id)
        unlisted = await self._unlist(account_id)
        _LOGGER.info(
            "account %s deleting: %d sessions ended, %d generations canceled,"
            " %d works off the square, purge at %d",
            account_id, ended, canceled, unlisted, at,
        )  # fmt: skip
        return Deleted(account_id, at)

    async def cancel_generations(self, account_id: str) -> int:
        """Cancel (and refund) every queued and running generation; tell the workers."""
        canceled = 0
        for fields in await self._generations.active(account_id):
            gid = fields["id"]
            outcome, _ = await self._generations.settle(account_id, gid, "cancel")
            if outcome == "OK":
                canceled += 1
                await self._jobs.cancel(gid)
        return canceled

    async def _unlist(self, account_id: str) -> int:
        """Take every listed work off the square, remembering it first."""
        unlisted = 0
        for wid in await _members(self._redis, f"{account_key(account_id)}:works"):
            owned = await self._works.owned(account_id, wid)
            if owned is None or not owned.record.get("published_at"):
                continue
            if owned.record.get("hidden"):
                continue  # off the square by reports: an operator's matter
            await self._redis.sadd(unlisted_key(account_id), wid)
            await self._square.remove(wid)
            unlisted += 1
        return unlisted

    async def restore(self, account_id: str, now: float | None = None) -> Restore:
        """Undo a deletion before its purge_at (any time before the purge, if None)."""
        reply = await self._run(account_id, "restore", "" if now is None else int(now))
        outcome = reply[0]
        if outcome in ("LIVE", "EXPIRED"):
            return Restore(outcome)
        await self._redis.zrem(PURGE_QUEUE, account_id)
        key = unlisted_key(account_id)
        found: set[bytes] = await self._redis.smembers(key)  # type: ignore[assignment]
        for wid in map(text, found):
            with contextlib.suppress(WorkNotFound):  # deleted meanwhile
                await self._works.publish(account_id, wid)
        await self._redis.delete(key)
        _LOGGER.info("account %s restored", account_id)
        return Restore.RESTORED

    async def on_sign_in(self, email: str) -> bool:
        """Restore the address's account if it is being deleted; say if it was.

        An account past its purge_at is let go of: the address is detached
        from it, so the sign-in opens a new account (without trial credits).
        """
        account_id = await self._accounts.find(email)
        if account_id is None:
            return False
        outcome = await self.restore(account_id, time.time())
        if outcome is Restore.EXPIRED:
            await self._accounts.detach(email, account_id)
        return outcome is Restore.RESTORED

    async def due(self, now: float, count: int = 100) -> list[str]:
        """List accounts whose purge_at passed, the longest waiting first."""
        found: list[bytes] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            PURGE_QUEUE, "-inf", now, start=0, num=count
        )
        return [text(member) for member in found]

    async def purge(self, account_id: str, now: float | None = None) -> bool:
        """Remove everything of an account whose purge_at passed; True if it did."""
        moment = int(time.time() if now is None else now)
        reply = await self._run(account_id, "begin_purge", moment)
        if reply[0] in ("GONE", "LIVE"):  # purged before, or restored
            await self._redis.zrem(PURGE_QUEUE, account_id)
            return bool(reply[0] == "GONE")
        if reply[0] == "EARLY":
            return False
        email, address = reply[1], reply[2]
        if email:
            await self._accounts.mark_trial(email, *([address] if address else []))
            await self._keep_suspension(account_id, email, address)
        await self._sessions.end_all(account_id)
        await self._drop_favorites(account_id)
        await self._drop_works(account_id)
        await self._finish_jobs(account_id)
        await self._sweep(account_id)
        await self._run(account_id, "keep", KEPT_SECONDS)
        if email:
            await self._forget_address(account_id, email, address)
        await self._delete_matching(_BUCKETS.format(subject=f"acct:{account_id}"))
        await self._redis.delete(account_key(account_id))
        await self._redis.zrem(PURGE_QUEUE, account_id)
        _LOGGER.info("account %s purged", account_id)
        return True

    async def _keep_suspension(self, account_id: str, email: str, address: str) -> None:
        """Leave a suspension with the address: it outlives the account it was on.

        A suspension since the address was first marked is there already; one
        from before that is carried here, with the time it has left.
        """
        key = suspension_key(account_id)
        at, until = await self._redis.hmget(key, ["at", "until"])
        if at is None:
            return
        seconds = int(await self._redis.ttl(key))
        await suspend_addresses(
            self._redis,
            self._accounts.address_keys(email, address),
            account_id,
            text(until) if until else None,
            seconds if seconds > 0 else None,
        )

    async def _drop_favorites(self, account_id: str) -> None:
        """Take back every favorite the account gave: others' counts drop exactly."""
        key = account_key(account_id)
        while wids := await _members(self._redis, f"{key}:favs", 0, 499):
            for wid in wids:
                try:
                    await self._works.favorite(account_id, wid, False)
                except WorkNotFound:
                    await self._redis.zrem(f"{key}:favs", wid)

    async def _drop_works(self, account_id: str) -> None:
        """Delete every work: its media, the square, others' lists of favorites."""
        key = account_key(account_id)
        while wids := await _members(self._redis, f"{key}:works", 0, 499):
            for wid in wids:
                owned = await self._works.owned(account_id, wid)
                if owned is not None:
                    for name in ("media_key", "thumb_key"):
                        if media_key := owned.record.get(name):
                            await self._media.delete(media_key)
                await self._redis.hdel(HIDDEN, wid)
                try:
                    await self._works.delete(account_id, wid)
                except WorkNotFound:
                    await self._redis.zrem(f"{key}:works", wid)

    async def _finish_jobs(self, account_id: str) -> None:
        """Drop the queue's records of the account's jobs (canceled at deletion)."""
        shard = shard_of(account_id)
        for gid in await _members(self._redis, f"{account_key(account_id)}:gens"):
            if await self._redis.exists(f"{prefix(shard)}:job:{gid}"):
                await self._jobs.finish(gid, shard_ref(shard))

    async def _sweep(self, account_id: str) -> None:
        """Delete every other key of the account but the kept ones and its hash.

        Uploads and exports leave the media store first: their record is the
        only pointer to the file.
        """
        account = account_key(account_id)
        async for name in slot_keys(self._redis, account, f"{account}:*"):
            if _kept(name, account):
                continue
            export = name.startswith(f"{account}:export:")
            upload = name.startswith(f"{account}:upload:")
            if (upload or export) and (
                media_key := await self._redis.hget(name, "key")
            ):
                await self._media.delete(text(media_key))
            if export:  # a pending one is not built any more
                eid = name.rsplit(":", 1)[1]
                await self._redis.zrem(EXPORT_QUEUE, f"{account_id}/{eid}")
            await self._redis.delete(name)

    async def _forget_address(self, account_id: str, email: str, address: str) -> None:
        """Detach the address from the account and drop its live codes."""
        await self._accounts.detach(email, account_id)
        for address_key in self._accounts.address_keys(email, address):
            await self._delete_matching(_CODES.format(address=address_key))

    async def _delete_matching(self, pattern: str) -> None:
        """Delete the keys of one hash tag that match a pattern."""
        async for name in slot_keys(self._redis, pattern, pattern):
            await self._redis.delete(name)
