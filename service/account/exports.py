"""Exports of my data: one per account a day, built by a worker, kept for 24 hours.

An export is a record in its account's slot (pending → ready | failed) and a
job in a queue every worker watches. A worker claims a job with a lease it
renews while it builds, so two workers never build one export at once and a
killed worker's export is taken up by another once the lease lapses; the
record only turns ready for the builder that holds it last. The ZIP goes to
the media store under an unguessable `exports/` key that the public /media/
route refuses, and a worker deletes it once it expired.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import secrets
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from ..store.connect import STORE_ERRORS
from ..studio.ledger import account_key, events_channel, iso, pairs, text
from ..studio.media.store import MediaStore, new_export_key

_LOGGER: Final = logging.getLogger(__name__)
_LUA: Final = Path(__file__).parent / "lua"
# One export per account in this many seconds; a ready one is kept as long.
WINDOW_SECONDS: Final = 24 * 3600
KEEP_SECONDS: Final = 24 * 3600
# How long an export nobody built, or one that failed, stays visible.
PENDING_TTL: Final = 7 * 24 * 3600
FAILED_TTL: Final = 24 * 3600
# Every account's export jobs, their leases and the files to delete when due.
QUEUE: Final = "studio:exports:{jobs}:queue"
LEASES: Final = "studio:exports:{jobs}:leases"
EXPIRING: Final = "studio:exports:{jobs}:expiring"
# Expired files deleted in one pass.
SWEEP_BATCH: Final = 100


class ExportRefused(Exception):
    """The account cannot export now; `code` says why (ACCOUNT_DELETING, NO_ACCOUNT)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class ExportTooSoon(Exception):
    """A pending or ready export was made within the window."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(retry_after)
        self.retry_after = retry_after


def export_record_key(account_id: str, eid: str) -> str:
    """Name an export's hash, under its account's hash tag."""
    return f"{account_key(account_id)}:export:{eid}"


def download_path(eid: str) -> str:
    """Where the owner's session fetches a ready export."""
    return f"/api/account/exports/{eid}/file"


def view(fields: Mapping[str, str]) -> dict[str, Any]:
    """Render an export as the API's JSON object (CONTRACT §9)."""
    ready = fields["status"] == "ready"
    return {
        "id": fields["id"],
        "status": fields["status"],
        "created_at": fields["created_at"],
        "expires_at": fields.get("expires_at") if ready else None,
        "download_url": download_path(fields["id"]) if ready else None,
    }


async def publish(redis: Redis, account_id: str, fields: Mapping[str, str]) -> None:
    """Tell the account's event streams how its export stands."""
    event = {"event": "export", "data": view(fields)}
    await redis.publish(events_channel(account_id), json.dumps(event))


class ExportStore:
    """Request an export (once a day) and read one of mine."""

    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._script = redis.register_script((_LUA / "exports.lua").read_text())

    async def request(self, account_id: str) -> dict[str, str]:
        """Record a pending export and queue its job; ExportRefused or ExportTooSoon."""
        eid = secrets.token_hex(12)
        moment = dt.datetime.now(dt.UTC).replace(microsecond=0)
        epoch = int(moment.timestamp())
        reply = await self._script(
            keys=[account_key(account_id)],
            args=["request", eid, epoch, iso(moment), WINDOW_SECONDS, PENDING_TTL],
        )
        outcome = text(reply[0])
        if outcome == "TOO_SOON":
            raise ExportTooSoon(max(1, int(reply[1])))
        if outcome != "OK":
            raise ExportRefused(outcome)
        fields = pairs(reply[1])
        await self._redis.zadd(QUEUE, {f"{account_id}/{eid}": epoch}, nx=True)
        await publish(self._redis, account_id, fields)
        return fields

    async def get(self, account_id: str, eid: str) -> dict[str, str] | None:
        """Return one of the account's exports, or None.

        A pending one is queued again if its job is missing (a crash between
        recording and queueing): reading it heals it.
        """
        found = await self._redis.hgetall(export_record_key(account_id, eid))
        fields = {text(k): text(v) for k, v in found.items()}
        if not fields:
            return None
        if fields["status"] == "ready" and time.time() >= float(fields["expires"]):
            return None  # past its 24 hours, whether or not the file is gone yet
        if fields["status"] == "pending":
            job = f"{account_id}/{eid}"
            await self._redis.zadd(QUEUE, {job: int(fields["created"])}, nx=True)
        return fields


class ExportJobs:
    """The worker's side: claim export jobs, build each ZIP, delete expired ones."""

    def __init__(
        self,
        redis: Redis,
        media: MediaStore,
        *,
        lease_seconds: float,
        poll_seconds: float = 1.0,
        privacy_url: str = "/privacy",
    ) -> None:
        self._redis = redis
        self._media = media
        self._lease = lease_seconds
        self._poll = poll_seconds
        self._privacy_url = privacy_url
        self._exports = redis.register_script((_LUA / "exports.lua").read_text())
        self._jobs = redis.register_script((_LUA / "jobs.lua").read_text())

    async def run(self, stop: asyncio.Event) -> None:
        """Build exports and delete expired ones until `stop` is set."""
        while not stop.is_set():
            worked = False
            try:
                await self.sweep()
                worked = await self.once(stop)
            except STORE_ERRORS as err:
                _LOGGER.warning("exports: store unavailable: %s", type(err).__name__)
            except Exception:  # a bug in one export must not end them all
                _LOGGER.exception("exports: pass failed")
            if not worked:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._poll)

    async def _job(self, action: str, job: str, token: str, *extra: Any) -> bool:
        reply = await self._jobs(
            keys=[QUEUE, LEASES], args=[action, job, token, *extra]
        )
        return bool(reply)

    async def once(self, stop: asyncio.Event | None = None) -> bool:
        """Claim one due export and build it; False when none was due.

        A `stop` set meanwhile interrupts the build and hands the job back, so
        another worker starts it at once.
        """
        token = secrets.token_urlsafe(16)
        claimed = await self._jobs(
            keys=[QUEUE, LEASES], args=["claim", self._lease, token]
        )
        if claimed is None:
            return False
        job = text(claimed)
        renewing = asyncio.create_task(self._renew(job, token))
        building = asyncio.create_task(self._build(job, token))
        stopping = asyncio.create_task((stop or asyncio.Event()).wait())
        try:
            done, _ = await asyncio.wait(
                {building, stopping}, return_when=asyncio.FIRST_COMPLETED
            )
            if building in done:
                building.result()
            else:
                building.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await building
                await self._job("hand_back", job, token)
        finally:
            for task in (renewing, stopping, building):
                task.cancel()
            await asyncio.gather(renewing, stopping, building, return_exceptions=True)
        return True

    async def _renew(self, job: str, token: str) -> None:
        """Keep the lease while the build runs; a store hiccup is tried again."""
        while True:
            await asyncio.sleep(self._lease / 3)
            try:
                if not await self._job("renew", job, token, self._lease):
                    return  # taken over: our result will be refused
            except STORE_ERRORS as err:
                _LOGGER.warning("exports: lease renewal: %s", type(err).__name__)

    async def _build(self, job: str, token: str) -> None:
        """Write the ZIP, store it and mark the export ready (if it is still ours)."""
        account_id, _, eid = job.partition("/")
        keys = [account_key(account_id)]
        started = await self._exports(keys=keys, args=["start", eid, token])
        if text(started[0]) != "OK":
            await self._job("done", job, token)  # built, failed or forgotten
            return
        key = new_export_key()
        # Known before the file exists, so no crash can leave it behind for good.
        await self._redis.zadd(EXPIRING, {key: time.time() + KEEP_SECONDS + 3600})
        try:
            await self._write(account_id, key)
        except (asyncio.CancelledError, *STORE_ERRORS):
            raise  # handed back, or left to the lease: another run will do it
        except Exception:
            _LOGGER.exception("export %s of %s failed", eid, account_id)
            await self._discard(key)
            failed = await self._exports(
                keys=keys, args=["fail", eid, token, FAILED_TTL]
            )
            if text(failed[0]) == "OK":
                await publish(self._redis, account_id, pairs(failed[1]))
            await self._job("done", job, token)
            return
        expires = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(
            seconds=KEEP_SECONDS
        )
        epoch = int(expires.timestamp())
        await self._redis.zadd(EXPIRING, {key: epoch})
        ready = await self._exports(
            keys=keys, args=["ready", eid, token, key, epoch, iso(expires)]
        )
        if text(ready[0]) == "OK":
            await publish(self._redis, account_id, pairs(ready[1]))
            _LOGGER.info("export %s of %s ready", eid, account_id)
        else:
            await self._discard(key)  # another worker built it meanwhile
        await self._job("done", job, token)

    async def _write(self, account_id: str, key: str) -> None:
        """Write the ZIP to a scratch file, then stream it into the media store."""
        from .archive import write_archive  # here: `serve` never builds one

        with tempfile.TemporaryDirectory(prefix="studio-export-") as scratch:
            path = Path(scratch) / "export.zip"
            with path.open("w+b") as out:
                await write_archive(
                    self._redis,
                    self._media,
                    account_id,
                    out,
                    privacy_url=self._privacy_url,
                )
            await self._media.put_file(key, path)

    async def _discard(self, key: str) -> None:
        await self._media.delete(key)
        await self._redis.zrem(EXPIRING, key)

    async def sweep(self, now: float | None = None) -> int:
        """Delete the files of exports past their 24 hours; count them."""
        due: list[bytes] = await self._redis.zrangebyscore(  # type: ignore[assignment]
            EXPIRING, "-inf", time.time() if now is None else now, 0, SWEEP_BATCH
        )
        for key in map(text, due):
            await self._discard(key)
        return len(due)
