"""Complaints about published works: anyone may file one; an operator decides each.

A report is a hash under one hash tag (`studio:reports:{reports}:…`), listed in
`:all` and, until decided, in `:open` (both scored by the time filed), so the
operator's queue is one sorted-set read. The terms promise an acknowledgement
at once (the 202 and its id) and a decision within DECIDE_HOURS. Each report
and each decision is also one moderation-log record.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from aiohttp import web
from redis.asyncio import Redis
from redis.typing import EncodableT, FieldT

from ..api.errors import ApiError
from ..api.payloads import json_response, read_json
from ..api.query import bad_field
from ..auth.sessions import anonymous
from ..square.feed import SQUARE
from ..studio.ledger import iso, text
from ..studio.media.pending import PendingMedia
from ..studio.media.store import MediaStore
from ..studio.takedown import withdraw_files
from ..studio.works import WorkNotFound, WorkStore
from .log import ModerationLog, Record
from .sanctions import Sanctions

CATEGORIES: Final = frozenset(
    {"illegal", "sexual", "violent", "infringement", "privacy", "other"}
)
MAX_REASON: Final = 500
DECIDE_HOURS: Final = 24
_PREFIX: Final = "studio:reports:{reports}"
_ALL: Final = f"{_PREFIX}:all"
_OPEN: Final = f"{_PREFIX}:open"
Decision = Literal["keep", "remove", "suspend"]


def _report_key(rid: str) -> str:
    return f"{_PREFIX}:r:{rid}"


class ReportNotFound(Exception):
    """No report has this id."""


class AlreadyDecided(Exception):
    """The report was decided before."""


@dataclass(frozen=True, slots=True)
class Filed:
    """A report as stored."""

    id: str
    work: str
    account: str
    category: str
    reason: str


class ReportStore:
    """File reports, list the queue, record decisions."""

    def __init__(self, redis: Redis, log: ModerationLog) -> None:
        self._redis = redis
        self._log = log

    async def file(self, work: str, author: str, category: str, reason: str) -> str:
        """Store a new open report and its log record; return its id."""
        rid = secrets.token_hex(10)
        filed = time.time()
        fields: dict[FieldT, EncodableT] = {
            "id": rid,
            "work": work,
            "account": author,
            "category": category,
            "reason": reason,
            "status": "open",
            "created_at": iso(_utc(filed)),
            "due_at": iso(_utc(filed + DECIDE_HOURS * 3600)),
        }
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_report_key(rid), mapping=fields)
            pipe.zadd(_ALL, {rid: filed})
            pipe.zadd(_OPEN, {rid: filed})
            await pipe.execute()
        await self._log.append(
            Record(
                source="report",
                verdict="reported",
                account=author,
                work=work,
                report=rid,
                field=category,
                text=reason,
            )
        )
        return rid

    async def get(self, rid: str) -> dict[str, str]:
        """Return one report; ReportNotFound if there is none."""
        found = await self._redis.hgetall(_report_key(rid))
        if not found:
            raise ReportNotFound(rid)
        return {text(k): text(v) for k, v in found.items()}

    async def listed(self, *, open_only: bool) -> AsyncIterator[dict[str, str]]:
        """Yield reports oldest first: the open ones, or all kept."""
        index = _OPEN if open_only else _ALL
        found: list[bytes] = await self._redis.zrange(index, 0, -1)  # type: ignore[assignment]
        for rid in map(text, found):
            try:
                yield await self.get(rid)
            except ReportNotFound:  # dropped with the log
                await self._redis.zrem(index, rid)

    async def decide(
        self,
        rid: str,
        decision: Decision,
        note: str,
        works: WorkStore,
        sanctions: Sanctions,
        media: MediaStore,
    ) -> dict[str, str]:
        """Carry out a decision, then mark the report decided and log it."""
        report = await self.get(rid)
        if report["status"] != "open":
            raise AlreadyDecided(rid)
        author, work = report["account"], report["work"]
        if decision in ("remove", "suspend"):
            with contextlib.suppress(WorkNotFound):  # deleted by its author meanwhile
                await works.remove(author, work)
                # The URLs the square gave out stop answering (takedown.py).
                pending = PendingMedia(self._redis)
                await withdraw_files(works, media, pending, author, work)
        if decision == "suspend":
            reason = note or f"report {rid}: {report['category']}"
            await sanctions.suspend(author, reason, None, source="report")
        decided: dict[FieldT, EncodableT] = {
            "status": "decided",
            "decision": decision,
            "note": note,
            "decided_at": iso(_utc(time.time())),
        }
        days = self._log.keep_days
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_report_key(rid), mapping=decided)
            pipe.expire(_report_key(rid), days * 86400)
            pipe.zrem(_OPEN, rid)
            pipe.zremrangebyscore(_ALL, "-inf", time.time() - days * 86400)
            await pipe.execute()
        await self._log.append(
            Record(
                source="operator",
                verdict=decision,
                account=author,
                work=work,
                report=rid,
                note=note,
            )
        )
        return {**report, **{str(k): str(v) for k, v in decided.items()}}


def _utc(epoch: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(int(epoch), dt.UTC)


REPORTS: Final = web.AppKey("reports", ReportStore)


def _field(body: Mapping[str, Any]) -> tuple[str, str]:
    reason, category = body["reason"], body["category"]
    if not isinstance(reason, str) or not 1 <= len(reason.strip()) <= MAX_REASON:
        raise bad_field("reason")
    if not isinstance(category, str) or category not in CATEGORIES:
        raise bad_field("category")
    return reason.strip(), category


# What a reporter is told of a decision: not whether the author was suspended.
_OUTCOMES: Final = {"keep": "kept", "remove": "removed", "suspend": "removed"}


def status_of(report: Mapping[str, str]) -> dict[str, str | None]:
    """Describe a report as its reporter may see it: nothing about the author."""
    decided = report["status"] == "decided"
    return {
        "id": report["id"],
        "status": "decided" if decided else "received",
        "outcome": _OUTCOMES.get(report.get("decision", "")) if decided else None,
        "created_at": report["created_at"],
        "due_at": report["due_at"],
        "decided_at": report.get("decided_at") if decided else None,
    }


@anonymous
async def report_status(request: web.Request) -> web.StreamResponse:
    """Tell whoever holds a report's id how it stands: received, or decided."""
    rid = request.match_info["report_id"]
    if not (len(rid) == 20 and rid.isascii() and rid.isalnum()):
        raise ApiError(404, "NOT_FOUND")
    try:
        report = await request.app[REPORTS].get(rid)
    except ReportNotFound:
        raise ApiError(404, "NOT_FOUND") from None
    return json_response(status_of(report))


@anonymous
async def report_square_work(request: web.Request) -> web.StreamResponse:
    """File a report on a work in the square, signed in or not: 202 and its id."""
    app = request.app
    body = await read_json(request, required={"reason", "category"}, name_field=True)
    reason, category = _field(body)
    wid = request.match_info["work_id"]
    author = (
        await app[SQUARE].owner(wid)
        if wid.isascii() and wid.isalnum() and len(wid) <= 64
        else None
    )
    if author is None:
        raise ApiError(404, "NOT_FOUND")
    rid = await app[REPORTS].file(wid, author, category, reason)
    return json_response({"id": rid, "status": "received"}, status=202)
