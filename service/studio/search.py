"""Find my generations and works by their prompt: any substring, any script.

No index: a search walks the account's own list (newest first, from the
cursor) in batches and keeps the items whose prompt contains the words,
compared case-folded, so Chinese (no word boundaries) matches as written.
Nothing else can go stale: a deleted work or a purged account is simply not in
the list any more. The price is a read of each skipped item, bounded by the
account's own size.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Final

from redis.asyncio import Redis

from ..api.query import bad_field
from .ledger import account_key, text

MAX_QUERY: Final = 100
# Items read per round trip while walking a list.
BATCH: Final = 200

Keep = Callable[[Sequence[str]], Awaitable[list[bool]]]


def read_query(query: Mapping[str, str]) -> str | None:
    """Read `q` (1–100 characters), case-folded; None when absent."""
    if "q" not in query:
        return None
    words = query["q"]
    if not 1 <= len(words) <= MAX_QUERY:
        raise bad_field("q")
    return words.casefold()


def contains(prompt: str | None, words: str) -> bool:
    """Tell whether a prompt holds the (case-folded) words."""
    return prompt is not None and words in prompt.casefold()


async def walk(
    redis: Redis, index: str, *, before: int | None, limit: int, keep: Keep
) -> tuple[list[str], int | None]:
    """Page a sorted set newest first, keeping only the members `keep` accepts.

    Returns the ids and the score to continue below (None on the last page).
    """
    top: int | str = f"({before}" if before is not None else "+inf"
    kept: list[tuple[str, int]] = []
    while len(kept) <= limit:
        found: list[tuple[bytes, float]] = await redis.zrevrangebyscore(  # type: ignore[assignment]
            index, top, "-inf", start=0, num=BATCH, withscores=True
        )
        ids = [text(member) for member, _ in found]
        flags = await keep(ids) if ids else []
        scores = [int(score) for _, score in found]
        kept += [
            (member, score)
            for member, score, flag in zip(ids, scores, flags, strict=True)
            if flag
        ]
        if len(found) < BATCH:
            break
        top = f"({int(found[-1][1])}"
    more = len(kept) > limit
    page = kept[:limit]
    return [wid for wid, _ in page], page[-1][1] if more and page else None


def generations_with(redis: Redis, account_id: str, words: str) -> Keep:
    """Keep the account's generations whose prompt holds the words."""
    key = account_key(account_id)

    async def keep(gids: Sequence[str]) -> list[bool]:
        async with redis.pipeline(transaction=False) as pipe:
            for gid in gids:
                pipe.hget(f"{key}:gen:{gid}", "prompt")
            prompts = await pipe.execute()
        return [contains(text(p) if p else None, words) for p in prompts]

    return keep


def works_with(
    redis: Redis, account_id: str, words: str | None, *, favorite_only: bool
) -> Keep:
    """Keep the account's own works (favorited ones, if asked) holding the words."""
    key = account_key(account_id)

    async def keep(wids: Sequence[str]) -> list[bool]:
        async with redis.pipeline(transaction=False) as pipe:
            for wid in wids:
                pipe.get(f"{key}:work:{wid}")
            pipe.hmget(f"{key}:favowner", list(wids))
            *records, owners = await pipe.execute()
        flags = []
        for record, owner in zip(records, owners, strict=True):
            prompt = json.loads(record)["prompt"] if record else None
            mine = not favorite_only or (
                owner is not None and text(owner) == account_id
            )
            flags.append(
                record is not None
                and mine
                and (words is None or contains(prompt, words))
            )
        return flags

    return keep
