"""Place in line and estimates: real Redis, real app, a real worker process."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from typing import Any

from redis.asyncio import Redis

from service.store.embedded import MailCatcher
from service.studio.generations import GenerationStore
from service.studio.ledger import Ledger
from service.studio.positions import Positions, Timings
from service.studio.queue import SHARDS, new_account_id, shard_of, waiting_key

from .conftest import Client, Env, MakeClient
from .workbench import sign_in, wait_for_status, worker_process


async def _submit(client: Client, prompt: str = "a lamp") -> dict[str, Any]:
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": prompt}
    )
    assert response.status == 202, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def _place(client: Client, gid: str) -> tuple[str, int | None, int | None]:
    body = await (await client.get(f"/api/generations/{gid}")).json()
    return body["status"], body["queue_position"], body["eta_seconds"]


async def test_five_queued_jobs_of_three_accounts_are_one_to_five_and_move_up(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """The line spans accounts and shards; a start moves everyone behind it up."""
    clients = [await studio() for _ in range(3)]
    for client in clients:
        await sign_in(client, mail_server)
    order = [clients[i] for i in (0, 1, 2, 0, 1)]
    jobs = [(client, await _submit(client)) for client in order]
    assert [job["queue_position"] for _, job in jobs] == [1, 2, 3, 4, 5]
    assert [(await _place(c, j["id"]))[1] for c, j in jobs] == [1, 2, 3, 4, 5]
    # No run finished yet: no estimate to give.
    assert {(await _place(c, j["id"]))[2] for c, j in jobs} == {None}
    listed = await (await clients[0].get("/api/generations")).json()
    assert [g["queue_position"] for g in listed["items"]] == [4, 1]
    env = {**studio_env, "STUDIO_WORKER_CONCURRENCY": "1", "STUDIO_DEMO_SECONDS": "1"}
    with worker_process(env):
        first_client, first = jobs[0]
        await wait_for_status(first_client, first["id"], {"running"})
        status, place, _ = await _place(first_client, first["id"])
        assert (status, place) == ("running", None)
        places = [(await _place(c, j["id"]))[1] for c, j in jobs[1:]]
        assert places == [1, 2, 3, 4]
        await wait_for_status(first_client, first["id"], {"succeeded"})
        second_client, second = jobs[1]
        await wait_for_status(second_client, second["id"], {"running", "succeeded"})
        last_client, last = jobs[4]
        # Workers flush timings every 1 s, windows are reread every 2 s.
        for _ in range(50):
            status, place, eta = await _place(last_client, last["id"])
            if eta is not None:
                break
            await asyncio.sleep(0.1)
        assert status == "queued"
        assert place is not None
        assert place <= 3
        # One run of seedream-4 took about a second: the wait is a few of them.
        assert eta is not None
        assert 1 <= eta <= 10 * place
        await wait_for_status(last_client, last["id"], {"succeeded"}, within=60)
    assert await _place(last_client, last["id"]) == ("succeeded", None, None)


async def test_every_way_out_of_the_line_leaves_no_trace_in_it(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Cancel, cancel-all and purge-free lines: the shards' sets end empty."""
    client = await studio()
    await sign_in(client, mail_server)
    first, second = await _submit(client), await _submit(client)
    assert second["queue_position"] == 2
    await client.post(f"/api/generations/{first['id']}/cancel")
    assert (await _place(client, second["id"]))[1] == 1
    await client.post(f"/api/generations/{second['id']}/cancel")
    assert sum([await redis.zcard(waiting_key(s)) for s in range(SHARDS)]) == 0


async def test_the_stream_pushes_a_new_place_at_most_every_two_seconds(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A queued job's event stream hears it move up without asking."""
    ahead, me = await studio(), await studio()
    await sign_in(ahead, mail_server)
    await sign_in(me, mail_server)
    for _ in range(2):
        await _submit(ahead)
    mine = await _submit(me)
    assert mine["queue_position"] == 3
    seen: list[tuple[float, int | None, str]] = []  # when, place, status

    async def listen() -> None:
        async with me.get("/api/events") as response:
            name = ""
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: ") and name == "generation":
                    data = json.loads(line[6:])
                    seen.append(
                        (time.monotonic(), data["queue_position"], data["status"])
                    )
                    if data["status"] == "succeeded":
                        return

    listener = asyncio.create_task(listen())
    env = {**studio_env, "STUDIO_WORKER_CONCURRENCY": "1", "STUDIO_DEMO_SECONDS": "1.5"}
    with worker_process(env):
        await asyncio.wait_for(listener, 60)
    queued = [(at, place) for at, place, status in seen if status == "queued"]
    assert queued[0][1] == 3
    places = [int(place or 0) for _, place in queued]
    assert places == sorted(places, reverse=True)
    assert 1 in places or 2 in places  # it heard itself move up
    moves = [
        at
        for (at, place), (_, before) in zip(queued[1:], queued, strict=False)
        if place != before
    ]
    assert all(b - a >= 1.9 for a, b in itertools.pairwise(moves))


async def test_a_position_costs_one_count_per_shard_whatever_the_depth(
    redis: Redis,
) -> None:
    """Ten thousand waiting jobs: a place is still the right number, at once."""
    async with redis.pipeline(transaction=False) as pipe:
        for n in range(10_000):
            pipe.zadd(waiting_key(n % SHARDS), {f"g{n}": 1_000_000 + n})
        await pipe.execute()
    positions = Positions(redis)
    fields = {
        "id": "g7000", "model": "seedream-4", "kind": "image", "prompt": "p",
        "size": "1024x1024", "count": "1", "seed": "1", "status": "queued",
        "progress": "0", "credits": "6", "created_at": "2026-11-27T00:00:00Z",
        "queued_us": str(1_000_000 + 7000),
    }  # fmt: skip
    (shown,) = await positions.views([fields])
    assert shown["queue_position"] == 7001


async def test_on_one_server_the_submit_counts_the_new_jobs_place_itself(
    redis: Redis,
) -> None:
    """Three accounts on three shards: the submit's reply carries places 1, 2, 3."""
    ledger = Ledger(redis, trial_credits=10, expire_months=24)
    store = GenerationStore(redis)
    accounts: dict[int, str] = {}
    while len(accounts) < 3:  # ids from the same draw new accounts use
        account = new_account_id()
        accounts.setdefault(shard_of(account), account)
    places = []
    for number, account in enumerate(accounts.values()):
        await ledger.open(account, f"p{number}@example.com", "x" * 32)
        submitted = await store.submit(
            account, f"g{number}", price=1, cap=4, idempotency="", body_hash="h",
            deadline=0, fields={"model": "seedream-4", "kind": "image", "prompt": "p",
                                "size": "1024x1024", "count": 1, "seed": 1},
        )  # fmt: skip
        places.append(submitted.place)
    assert places == [1, 2, 3]
    views = await Positions(redis).views([submitted.fields])
    assert views[0]["queue_position"] == 3  # what counting afresh finds too


async def test_the_estimate_is_the_mean_run_plus_the_median_start_gap_per_job_ahead(
    redis: Redis,
) -> None:
    """Windows with an even number of gaps (the median averages the middle two)."""
    timings = Timings()
    starts = [100.0, 101.0, 103.0, 107.0, 108.0]  # gaps 1, 2, 4, 1
    runs = [4.0, 6.0, 11.5]
    for moment in starts:
        timings.started(moment)
    for seconds in runs:
        timings.ran("seedream-4", seconds)
    await timings.flush(redis)
    fields = {
        "id": "g1", "model": "seedream-4", "kind": "image", "prompt": "p",
        "size": "1024x1024", "count": "1", "seed": "1", "status": "queued",
        "progress": "0", "credits": "6", "created_at": "2026-11-27T00:00:00Z",
        "queued_us": "1",
    }  # fmt: skip
    (shown,) = await Positions(redis).views([fields], known={"g1": 4})
    gap = statistics.median(b - a for a, b in itertools.pairwise(starts))
    assert gap == 1.5
    assert shown["eta_seconds"] == round(3 * gap + statistics.fmean(runs)) == 12
