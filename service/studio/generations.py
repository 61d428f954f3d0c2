"""Generations in Redis: submitted, charged and settled by account scripts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from redis.asyncio import Redis

from ..store.connect import is_cluster
from ..store.durable import DurableScripts
from .ledger import account_key, iso, now, pairs, script, text
from .queue import SHARDS, prefix, shard_of, waiting_key

MAX_PROMPT: Final = 2000
MAX_NEGATIVE_PROMPT: Final = 1000
MAX_SEED: Final = 4_294_967_295
IDEMPOTENCY_SECONDS: Final = 24 * 3600
LIVE: Final = frozenset({"queued", "running"})


class SubmitRefused(Exception):
    """The account script refused a submission; `code` says why."""

    def __init__(self, code: str, balance: int | None = None) -> None:
        super().__init__(code)
        self.code = code
        self.balance = balance


@dataclass(frozen=True, slots=True)
class Submitted:
    """A generation as the submit left it, and whether it was a replay."""

    fields: dict[str, str]
    replayed: bool
    # Its place in line, where the submit could count it (one server).
    place: int | None = None


def generation_key(account_id: str, gid: str) -> str:
    """Name a generation's hash, under its owner's hash tag."""
    return f"{account_key(account_id)}:gen:{gid}"


def idempotency_key(account_id: str, key: str) -> str:
    """Name an Idempotency-Key record of one account."""
    return f"{account_key(account_id)}:idem:{key}"


def view(fields: Mapping[str, str]) -> dict[str, Any]:
    """Render a stored generation as the API's JSON object."""
    out: dict[str, Any] = {
        "id": fields["id"],
        "model": fields["model"],
        "kind": fields["kind"],
        "prompt": fields["prompt"],
        "negative_prompt": fields.get("negative_prompt", ""),
        "size": fields["size"],
        "count": int(fields["count"]),
        "seed": int(fields["seed"]),
    }
    if reference := fields.get("reference"):
        out["reference"] = reference
    out |= {
        "status": fields["status"],
        "progress": float(fields["progress"]),
        "credits": int(fields["credits"]),
        "refunded": fields.get("refunded") == "1",
        "created_at": fields["created_at"],
        "started_at": fields.get("started_at"),
        "finished_at": fields.get("finished_at"),
        "error": fields.get("error"),
        "works": json.loads(fields.get("works", "[]")),
        "preset": fields.get("preset") or None,
        # Filled in by positions.py for queued and running generations.
        "queue_position": None,
        "eta_seconds": None,
    }
    return out


class GenerationStore:
    """Submit, settle, read and list one account's generations."""

    def __init__(self, redis: Redis, wait_replicas: int = 0) -> None:
        self._redis = redis
        self._durable = DurableScripts(redis, wait_replicas)
        self._submit = script(redis, "submit")
        # One server: the submit also counts the new job's place in every line.
        # A cluster keeps each line in its own slot: positions.py counts there.
        self._lines = (
            [] if is_cluster(redis) else [waiting_key(n) for n in range(SHARDS)]
        )
        self._settle = script(redis, "settle", uses=["finish_job"])

    async def remembered(self, account_id: str, key: str) -> tuple[str, str] | None:
        """Return (body hash, generation id) kept for an Idempotency-Key."""
        raw = await self._redis.get(idempotency_key(account_id, key))
        if raw is None:
            return None
        record = json.loads(raw)
        return str(record["h"]), str(record["g"])

    async def submit(
        self,
        account_id: str,
        gid: str,
        *,
        price: int,
        cap: int,
        idempotency: str,
        body_hash: str,
        deadline: float,
        fields: Mapping[str, str | int],
    ) -> Submitted:
        """Charge, record and enqueue a generation in one step, or SubmitRefused."""
        moment = now()
        args: list[str | int] = [
            gid, idempotency, body_hash, price, cap,
            int(moment.timestamp()), iso(moment), int(deadline),
        ]  # fmt: skip
        for name, value in fields.items():
            args += [name, value]
        keys = [account_key(account_id), prefix(shard_of(account_id)), *self._lines]
        reply = await self._durable.run(self._submit, keys, args)
        outcome = text(reply[0])
        if outcome == "OK":
            place = int(reply[2]) if len(reply) > 2 else None
            return Submitted(pairs(reply[1]), replayed=False, place=place)
        if outcome == "REPLAY":
            return Submitted(pairs(reply[1]), replayed=True)
        balance = int(reply[1]) if len(reply) > 1 else None
        raise SubmitRefused(outcome, balance)

    async def settle(
        self, account_id: str, gid: str, action: str, *extra: str, ack: str = ""
    ) -> tuple[str, dict[str, str]]:
        """Apply one transition; return its outcome and the generation after it.

        `ack`, a stream entry of the account's shard (`entry_in`), finishes the
        job in the same step when the transition ends it or finds it ended.
        """
        keys = [account_key(account_id), prefix(shard_of(account_id))]
        args = [gid, action, iso(now()), ack, *extra]
        if action == "progress":  # moves no money: no wait for replicas
            reply = await self._settle(keys=keys, args=args)
        else:
            reply = await self._durable.run(self._settle, keys, args)
        outcome = text(reply[0])
        return outcome, pairs(reply[1]) if len(reply) > 1 else {}

    async def get(self, account_id: str, gid: str) -> dict[str, str] | None:
        """Return one of the account's generations."""
        fields = await self._redis.hgetall(generation_key(account_id, gid))
        return {text(k): text(v) for k, v in fields.items()} or None

    async def page(
        self, account_id: str, *, before: int | None, limit: int
    ) -> tuple[list[dict[str, str]], int | None]:
        """List generations newest first; the cursor is a submit sequence number."""
        top: int | str = f"({before}" if before is not None else "+inf"
        found: Sequence[tuple[bytes, float]] = await self._redis.zrevrangebyscore(  # type: ignore[assignment]
            f"{account_key(account_id)}:gens", top, "-inf",
            start=0, num=limit + 1, withscores=True,
        )  # fmt: skip
        rows = list(found[:limit])
        async with self._redis.pipeline(transaction=False) as pipe:
            for gid, _ in rows:
                pipe.hgetall(generation_key(account_id, text(gid)))
            records = await pipe.execute()
        items = [{text(k): text(v) for k, v in r.items()} for r in records if r]
        more = len(found) > limit
        return items, int(rows[-1][1]) if more and rows else None

    async def upload_size(self, key: str) -> tuple[int, int] | None:
        """An upload's width and height, or None when there is no such upload."""
        width, height = await self._redis.hmget(key, ["width", "height"])
        if width is None or height is None:
            return None
        return int(width), int(height)

    async def record_upload(
        self, account_id: str, upload_id: str, record: Mapping[str, str | int]
    ) -> None:
        """Keep an upload's media key and size under its owner."""
        await self._redis.hset(
            f"{account_key(account_id)}:upload:{upload_id}",
            mapping=dict(record),  # type: ignore[arg-type]
        )

    async def active(self, account_id: str) -> list[dict[str, str]]:
        """Return the account's queued and running generations."""
        gids = await self._redis.smembers(f"{account_key(account_id)}:active")
        async with self._redis.pipeline(transaction=False) as pipe:
            for gid in sorted(gids):
                pipe.hgetall(generation_key(account_id, text(gid)))
            records = await pipe.execute()
        return [{text(k): text(v) for k, v in r.items()} for r in records if r]
