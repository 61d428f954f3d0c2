"""The moderation log: one append-only record per refusal, report and operator action.

Records go to one Redis stream per UTC day (`studio:modlog:{YYYY-MM-DD}`, its
own hash tag: each append is one key, so it runs unchanged on a cluster). A
day's stream expires `moderation.log_days` days after the day ends, so the log
keeps at least that long and then drops a whole day at a time. Streams are
only ever appended to (XADD); nothing edits or deletes a record before then.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass
from typing import Final

from redis.asyncio import Redis

from ..clock import Clock, midnight, utc_now

_PREFIX: Final = "studio:modlog"
_PAGE: Final = 1000


@dataclass(frozen=True, slots=True)
class Record:
    """What happened, to whom and to what, and why (CONTRACT §11)."""

    # Where the decision was taken: prompt (submit), publish, upstream, output,
    # report, operator.
    source: str
    # blocked, reported, suspended, restored, keep, remove, suspend.
    verdict: str
    account: str = ""
    generation: str = ""
    work: str = ""
    report: str = ""
    # The listed term that matched, or the provider's or upstream's label.
    rule: str = ""
    # The text checked (a prompt; a report's reason).
    text: str = ""
    # The field refused, a report's category, an operator's note.
    field: str = ""
    note: str = ""


def upstream_refusal(account: str, generation: Mapping[str, str]) -> Record:
    """Describe a generation an upstream refused for its content."""
    return Record(
        source="upstream",
        verdict="blocked",
        account=account,
        generation=generation.get("id", ""),
        rule=f"{generation.get('model', '')}: CONTENT_BLOCKED",
        text=generation.get("prompt", ""),
    )


def day_key(day: dt.date) -> str:
    """Name the stream of one UTC day."""
    return f"{_PREFIX}:{{{day.isoformat()}}}"


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class ModerationLog:
    """Append records; read them back by day, oldest first."""

    def __init__(self, redis: Redis, keep_days: int, clock: Clock = utc_now) -> None:
        self._redis = redis
        self.keep_days = keep_days
        self._clock = clock

    async def append(self, record: Record) -> str:
        """Add one record to today's stream; return its id."""
        now = self._clock()
        key = day_key(now.date())
        fields = {"at": now.isoformat(timespec="milliseconds")} | {
            name: value for name, value in asdict(record).items() if value
        }
        drop_at = midnight(now.date()) + dt.timedelta(days=self.keep_days + 1)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.xadd(key, fields)
            pipe.expireat(key, int(drop_at.timestamp()))
            entry, _ = await pipe.execute()
        return _text(entry)

    def first_day(self) -> dt.date:
        """Return the oldest day the log may still hold."""
        return self._clock().date() - dt.timedelta(days=self.keep_days)

    async def read(
        self, since: dt.date | None = None, account: str | None = None
    ) -> AsyncIterator[dict[str, str]]:
        """Yield the records from `since` (default: the oldest kept) to now."""
        day = max(since or self.first_day(), self.first_day())
        today = self._clock().date()
        while day <= today:
            key, start = day_key(day), "-"
            while True:
                page: list[tuple[bytes, dict[bytes, bytes]]] = await self._redis.xrange(
                    key, min=start, count=_PAGE
                )  # type: ignore[assignment]
                for entry, fields in page:
                    record = {_text(k): _text(v) for k, v in fields.items()}
                    if account is None or record.get("account") == account:
                        yield {"id": _text(entry), **record}
                if len(page) < _PAGE:
                    break
                start = "(" + _text(page[-1][0])
            day += dt.timedelta(days=1)
