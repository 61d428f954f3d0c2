"""Works: a person's library, favorites, publishing to the square and reports."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis

from ..square.feed import SquareStore, Work
from .ledger import account_key, call_key, iso, now, text

_SCRIPT: Final = (Path(__file__).parent / "lua" / "works.lua").read_text()
_MARK: Final = (Path(__file__).parent / "lua" / "favmark.lua").read_text()
# Fields of the stored record that no client sees.
_PRIVATE: Final = frozenset({"media_key", "thumb_key", "hidden", "favorite"})


# A file of a work moving: the key it holds, the new key and the new key's URL
# (all "" for a work without that file).
Moved = tuple[str, str, str]


class WorkNotFound(Exception):
    """Neither mine nor published: the same answer for both."""


class WorkRemoved(Exception):
    """An operator removed the work after a report: it is not published again."""


@dataclass(frozen=True, slots=True)
class Owned:
    """A work of mine as stored, with its live favorite count."""

    record: dict[str, Any]
    favorites: int


def mine_view(
    record: Mapping[str, Any], favorites: int, favorite: bool
) -> dict[str, Any]:
    """Render one of my works: the full shape, with generation_id."""
    out = {k: v for k, v in record.items() if k not in _PRIVATE}
    out["favorites"] = favorites
    out["favorite"] = favorite
    return out


def square_work(record: Mapping[str, Any], favorites: int) -> Work:
    """Describe a work of mine as the square shows it: nothing about me."""
    return Work(
        id=record["id"],
        kind=record["kind"],
        model=record["model"],
        prompt=record["prompt"],
        media_url=record["media_url"],
        thumb_url=record["thumb_url"],
        width=record["width"],
        height=record["height"],
        content_type=record["content_type"],
        published_at=record["published_at"],
        favorites=favorites,
        duration=record.get("duration"),
    )


class WorkStore:
    """The owner-slot half of every work operation; the square is the other half."""

    def __init__(self, redis: Redis, square: SquareStore) -> None:
        self._redis = redis
        self._square = square
        self._script = redis.register_script(_SCRIPT)
        self._mark = redis.register_script(_MARK)

    async def _run(self, owner: str, *args: str | int, once: bool = False) -> list[Any]:
        """Run an action; `once` for one a retry must not redo (works.lua)."""
        keys = [account_key(owner)]
        if once:
            keys.append(call_key(owner))
        reply = await self._script(keys=keys, args=list(args))
        if text(reply[0]) == "NOT_FOUND":
            raise WorkNotFound
        if text(reply[0]) == "REMOVED":
            raise WorkRemoved
        return list(reply)

    async def owned(self, owner: str, wid: str) -> Owned | None:
        """Read one of an account's works with its favorite count."""
        key = f"{account_key(owner)}:work:{wid}"
        async with self._redis.pipeline(transaction=False) as pipe:
            pipe.get(key)
            pipe.scard(f"{key}:fans")
            raw, count = await pipe.execute()
        return Owned(json.loads(raw), int(count)) if raw else None

    async def favorited(self, me: str, wids: Sequence[str]) -> list[bool]:
        """Tell which of these works I favorited."""
        if not wids:
            return []
        scores = await self._redis.zmscore(f"{account_key(me)}:favs", list(wids))
        return [score is not None for score in scores]

    async def owner_of(self, me: str, wid: str) -> str:
        """Return whose work this is: mine, or a published one's author; else 404."""
        if await self._redis.exists(f"{account_key(me)}:work:{wid}"):
            return me
        owner = await self._square.owner(wid)
        if owner is None:
            raise WorkNotFound
        return owner

    async def publish(self, me: str, wid: str) -> dict[str, Any]:
        """Mark my work published, then put it in the square (unless hidden)."""
        _, raw, count, hidden = await self._run(me, "publish", wid, iso(now()))
        record = json.loads(raw)
        if not int(hidden):
            await self._square.publish(square_work(record, int(count)), me)
        return mine_view(record, int(count), (await self.favorited(me, [wid]))[0])

    async def remove(self, owner: str, wid: str) -> None:
        """Take a work off the square for good (an operator upheld a report)."""
        await self._square.remove(wid)
        await self._run(owner, "remove", wid, iso(now()))
        await self._redis.hdel(HIDDEN, wid)

    async def rekey(self, owner: str, wid: str, media: Moved, thumb: Moved) -> bool:
        """Point a work at its files' new keys, if it still holds the old ones."""
        reply = await self._run(owner, "rekey", wid, *media, *thumb)
        return text(reply[0]) == "OK"

    async def unpublish(self, me: str, wid: str) -> dict[str, Any]:
        """Take my work off the square first, then mark it unpublished."""
        if not await self._redis.exists(f"{account_key(me)}:work:{wid}"):
            raise WorkNotFound
        await self._square.remove(wid)
        _, raw, count = await self._run(me, "unpublish", wid)
        return mine_view(
            json.loads(raw), int(count), (await self.favorited(me, [wid]))[0]
        )

    async def delete(self, me: str, wid: str) -> dict[str, Any]:
        """Remove my work from the square, my library and its fans' favorites."""
        if not await self._redis.exists(f"{account_key(me)}:work:{wid}"):
            raise WorkNotFound
        await self._square.remove(wid)
        _, raw, fans = await self._run(me, "delete", wid, once=True)
        async with self._redis.pipeline(transaction=False) as pipe:
            for fan in fans:
                fan_key = account_key(text(fan))
                pipe.zrem(f"{fan_key}:favs", wid)
                pipe.hdel(f"{fan_key}:favowner", wid)
                pipe.hdel(f"{fan_key}:favat", wid)
                pipe.hdel(f"{fan_key}:favver", wid)
            await pipe.execute()
        record: dict[str, Any] = json.loads(raw)
        return record

    async def favorite(self, me: str, wid: str, on: bool) -> None:
        """Add or remove my favorite; the count is exact under any concurrency."""
        # Either way only on a work I can see (CONTRACT §6: 404 when neither mine
        # nor published): a favorite of a work taken off the square stays, unseen,
        # until it comes back.
        owner = await self.owner_of(me, wid)
        try:
            _, count, change, _, listed = await self._run(
                owner, "favorite" if on else "unfavorite", wid, me
            )
        except WorkNotFound:
            if on:
                raise
            count, change, listed = 0, 0, 0  # gone meanwhile: just forget it
        # My side follows the owner's in its order (favmark.lua): racing
        # requests of mine end with my list agreeing with the count.
        await self._mark(
            keys=[account_key(me)],
            args=["1" if on else "0", wid, int(change) or "", owner, iso(now())],
        )
        if int(listed):
            await self._square.set_favorites(wid, int(count), int(change))

    async def report(self, me: str, wid: str, threshold: int) -> tuple[str, str]:
        """Count a distinct reporter; at the threshold the work leaves the square.

        Returns the outcome (OK: counted; HIDE: counted, and the work left the
        square; REPEAT: this reporter counted before; SELF: the owner's own,
        counted for nothing) and whose work it is.
        """
        try:
            owner = await self.owner_of(me, wid)
        except WorkNotFound:  # hidden by reports: a repeat of mine still counts once
            hidden = await self._redis.hget(HIDDEN, wid)
            if hidden is None:
                raise
            owner = text(hidden)
        reply = await self._run(owner, "report", wid, me, threshold, once=True)
        outcome = text(reply[0])
        if outcome == "HIDE":
            # Whose it is is kept before it leaves the square, so a report that
            # races this one finds its owner in one place or the other.
            await self._redis.hset(HIDDEN, wid, owner)
            await self._square.remove(wid)
        return outcome, owner

    async def restore(self, wid: str) -> bool:
        """Bring a hidden work back to the square (an operator's decision)."""
        owner = await self._redis.hget(HIDDEN, wid)
        if owner is None:
            return False
        _, raw, count = await self._run(text(owner), "restore", wid)
        record = json.loads(raw)
        if record.get("published_at"):
            await self._square.publish(square_work(record, int(count)), text(owner))
        await self._redis.hdel(HIDDEN, wid)
        return True

    async def author_of(self, wid: str) -> str | None:
        """Whose work this is, if it is in the square or hidden by reports."""
        owner = await self._square.owner(wid)
        if owner is None and (hidden := await self._redis.hget(HIDDEN, wid)):
            owner = text(hidden)
        return owner

    async def take_down(self, wid: str) -> bool:
        """Unpublish any work by id (an operator's decision)."""
        owner = await self._square.owner(wid)
        if owner is None:
            return False
        await self.unpublish(owner, wid)
        return True

    async def page(
        self, me: str, *, before: int | None, limit: int, favorite_only: bool
    ) -> tuple[list[dict[str, Any]], int | None]:
        """List my works newest first (only those I favorited, if asked)."""
        key = account_key(me)
        rows: list[tuple[bytes, float]]
        if favorite_only:
            # My favorites include others' works: the ones in my own index too,
            # each with its own index's score (newest first, not favorited first).
            rows = await self._redis.zinter(  # type: ignore[assignment]
                {f"{key}:works": 1, f"{key}:favs": 0}, withscores=True
            )
            rows.reverse()
            if before is not None:
                rows = [row for row in rows if row[1] < before]
            rows = rows[: limit + 1]
        else:
            top: int | str = f"({before}" if before is not None else "+inf"
            rows = await self._redis.zrevrangebyscore(  # type: ignore[assignment]
                f"{key}:works", top, "-inf", start=0, num=limit + 1, withscores=True
            )
        more = len(rows) > limit
        rows = rows[:limit]
        items = await self.views(me, [text(wid) for wid, _ in rows])
        return items, int(rows[-1][1]) if more and rows else None

    async def views(self, me: str, wids: Sequence[str]) -> list[dict[str, Any]]:
        """Render works of mine, in order, skipping any deleted meanwhile."""
        key = account_key(me)
        async with self._redis.pipeline(transaction=False) as pipe:
            for wid in wids:
                pipe.get(f"{key}:work:{wid}")
                pipe.scard(f"{key}:work:{wid}:fans")
            replies = await pipe.execute()
        flags = await self.favorited(me, wids)
        out = []
        for index, flag in enumerate(flags):
            raw, count = replies[2 * index], replies[2 * index + 1]
            if raw:
                out.append(mine_view(json.loads(raw), int(count), flag))
        return out

    async def favorites_page(
        self, me: str, *, before: int | None, limit: int
    ) -> tuple[list[dict[str, Any]], int | None]:
        """List works I favorited, most recent favorite first.

        Favorites of works no longer shown (unpublished, hidden by reports) stay
        in my list, unseen, in case they come back: a page passes over them and
        still holds `limit` works while there are more, looking at no more than
        FAVORITES_SCANNED of them (past that, a shorter page and a cursor).
        """
        key = account_key(me)
        items: list[dict[str, Any]] = []
        last: int | None = before
        scanned = 0
        while scanned < FAVORITES_SCANNED:
            top: int | str = f"({last}" if last is not None else "+inf"
            rows: list[tuple[bytes, float]] = await self._redis.zrevrangebyscore(  # type: ignore[assignment]
                f"{key}:favs", top, "-inf", start=0, num=limit + 1, withscores=True
            )
            scanned += len(rows)
            shown = await self._favorite_views(me, [text(wid) for wid, _ in rows])
            for (_, score), item in zip(rows, shown, strict=True):
                if item is None:
                    continue
                if len(items) == limit:  # one more is shown: a next page
                    return items, last
                items.append(item)
                last = int(score)
            if len(rows) <= limit:  # the list ends here
                return items, None
            last = int(rows[-1][1])
        return items, last

    async def _favorite_views(
        self, me: str, wids: Sequence[str]
    ) -> list[dict[str, Any] | None]:
        """Render favorites in order: mine as my works, others' as the square shows
        them; None for one no longer shown."""
        if not wids:
            return []
        owners = await self._redis.hmget(f"{account_key(me)}:favowner", list(wids))
        mine = {
            wid
            for wid, owner in zip(wids, owners, strict=True)
            if owner is not None and text(owner) == me
        }
        views = {view["id"]: view for view in await self.views(me, list(mine))}
        others = [wid for wid in wids if wid not in mine]
        published = dict(zip(others, await self._square.get_many(others), strict=True))
        out: list[dict[str, Any] | None] = []
        for wid in wids:
            work = published.get(wid)
            out.append(
                views.get(wid) if work is None else {**work.public(), "favorite": True}
            )
        return out


# Favorites a page looks at, at most, passing over those no longer shown.
FAVORITES_SCANNED: Final = 500


# The works their owners hid from the square (an account's deletion clears its own).
HIDDEN: Final = "studio:square:{square}:hidden"
