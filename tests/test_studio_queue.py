"""The job queue's reads: oldest first, one round trip for many shards, idlers wait."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from redis.asyncio import Redis

from service.store.embedded import MailCatcher
from service.studio.generations import GenerationStore
from service.studio.queue import JobQueue, entry_in, shard_of, stream

from .conftest import Client, MakeClient
from .workbench import ledger, sign_in


async def _submit(client: Client) -> str:
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
    )
    assert response.status == 202, await response.text()
    body: dict[str, Any] = await response.json()
    return str(body["id"])


async def _people(
    studio: MakeClient, mail_server: MailCatcher, shards: int
) -> list[Client]:
    """Signed-in people whose accounts sit on `shards` different queue shards."""
    found: dict[int, Client] = {}
    while len(found) < shards:
        client = await studio()
        found.setdefault(shard_of((await sign_in(client, mail_server))["id"]), client)
    return list(found.values())


async def _calls(redis: Redis) -> dict[str, int]:
    stats: dict[str, Any] = await redis.info("commandstats")
    return {name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0)) for name in (
        "evalsha", "xreadgroup", "zrange"
    )}  # fmt: skip


async def test_one_read_takes_the_oldest_jobs_of_several_shards_in_one_round_trip(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Submitted a, b, a, b, c, c: a read of four takes the first four at once."""
    a, b, c = await _people(studio, mail_server, 3)
    order = [await _submit(person) for person in (a, b, a, b, c, c)]
    queue = JobQueue(redis)
    await queue.ensure_group()
    assert await queue.take("0/0-0", "nobody") == {}  # the script loaded
    before = await _calls(redis)
    taken = (await queue.read("reader", 4)).jobs
    after = await _calls(redis)
    # one script run: every shard's line looked at, the two shards with a share
    # read, nothing sent on its own
    assert {name: after[name] - before[name] for name in after} == {
        "evalsha": 1,
        "zrange": 16,
        "xreadgroup": 2,
    }
    # A batch starts at once: within it, jobs come shard by shard.
    assert sorted(gid for _, gid in taken) == sorted(order[:4])
    for ref, gid in taken:  # as a worker does next: they no longer wait
        assert (await queue.take(ref, gid))["attempts"] == "1"
    rest = (await queue.read("reader", 4)).jobs
    assert sorted(gid for _, gid in rest) == sorted(order[4:])


async def test_a_read_takes_no_more_from_a_shard_than_its_oldest_jobs_warrant(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """a, b, a, a: a read of two takes the first a and the b; two a's stay."""
    a, b = await _people(studio, mail_server, 2)
    order = [await _submit(person) for person in (a, b, a, a)]
    queue = JobQueue(redis)
    await queue.ensure_group()
    taken = (await queue.read("reader", 2)).jobs
    assert sorted(gid for _, gid in taken) == sorted(order[:2])
    for ref, gid in taken:
        await queue.take(ref, gid)
    other = (await queue.read("another", 8)).jobs
    assert [gid for _, gid in other] == order[2:]


async def test_a_read_whose_planned_jobs_others_took_takes_no_more_than_asked(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Another worker took the oldest and has not started them: still at most one."""
    people = await _people(studio, mail_server, 3)
    for person in people:
        await _submit(person)
    queue = JobQueue(redis)
    await queue.ensure_group()
    assert len((await queue.read("first", 2)).jobs) == 2  # not taken yet
    late = await queue.read("second", 1)
    assert late.waiting
    assert len(late.jobs) <= 1
    everything = (await queue.read("third", 8)).jobs + late.jobs
    assert len(everything) == 1  # the third job, whoever got it


async def test_an_idle_wait_ends_with_the_next_submit_and_delivers_nothing(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """With nothing queued, a read is empty and the wait lasts until a submit."""
    (person,) = await _people(studio, mail_server, 1)
    queue = JobQueue(redis)
    await queue.ensure_group()
    idle = await queue.read("reader", 4)
    assert (idle.jobs, idle.waiting) == ([], False)
    started = time.monotonic()
    await queue.wait(300)
    assert time.monotonic() - started >= 0.25  # it waited, then gave up
    waiting = asyncio.ensure_future(queue.wait(5000))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    gid = await _submit(person)
    await asyncio.wait_for(waiting, 3)  # the submit ended it
    taken = (await queue.read("reader", 4)).jobs
    assert [g for _, g in taken] == [gid]  # the wait itself delivered nothing


async def _pending(redis: Redis, ref: str) -> int:
    """How many deliveries of the ref's shard no worker has acknowledged."""
    shard = int(ref.split("/", 1)[0])
    summary: dict[str, Any] = await redis.xpending(stream(shard), "workers")
    return int(summary["pending"])


async def test_a_transition_that_ends_a_job_acknowledges_it_in_the_same_script_call(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """start, then fail with ack: that one call ends it, refunds it, takes it out.

    No worker runs here and nothing else is called: the script itself acked it.
    """
    (person,) = await _people(studio, mail_server, 1)
    gid = await _submit(person)
    account = (await (await person.get("/api/me")).json())["id"]
    queue = JobQueue(redis)
    await queue.ensure_group()
    ((ref, taken),) = (await queue.read("reader", 1)).jobs
    assert taken == gid
    await queue.take(ref, gid)
    store = GenerationStore(redis)
    started, _ = await store.settle(account, gid, "start", ack=entry_in(ref, account))
    assert started == "STARTED"
    assert await _pending(redis, ref) == 1  # a running job stays delivered
    outcome, fields = await store.settle(
        account, gid, "fail", "UPSTREAM_FAILED", ack=entry_in(ref, account)
    )
    assert (outcome, fields["refunded"]) == ("OK", "1")
    assert await _pending(redis, ref) == 0
    assert await queue.depth() == 0
    assert await queue.take(ref, gid) == {}  # its record is gone: nothing runs again
    # A duplicate delivery's settle finds it ended: no second refund.
    again, _ = await store.settle(account, gid, "start", ack=entry_in(ref, account))
    assert again == "FINISHED"
    assert [entry["kind"] for entry in await ledger(person)] == [
        "grant",
        "debit",
        "refund",
    ]


async def test_a_job_canceled_before_its_turn_leaves_the_queue_at_once(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Its entry and record go with the cancel; one read before, it is found gone."""
    (person,) = await _people(studio, mail_server, 1)
    first, second = await _submit(person), await _submit(person)
    queue = JobQueue(redis)
    await queue.ensure_group()
    ((ref, taken),) = (await queue.read("reader", 1)).jobs  # handed out, not started
    assert taken == first
    for gid in (first, second):
        response = await person.post(f"/api/generations/{gid}/cancel")
        assert response.status == 200, await response.text()
    assert await queue.depth() == 0
    assert await redis.xlen(stream(int(ref.split("/", 1)[0]))) == 0
    assert await _pending(redis, ref) == 0
    assert await queue.take(ref, first) == {}  # the worker that has it does nothing
    assert (await queue.read("reader", 8)).jobs == []


async def _strays_left(redis: Redis, shard: int) -> tuple[int, int]:
    """The entries a shard's stream holds, and those delivered and not acknowledged."""
    pending: dict[str, Any] = await redis.xpending(stream(shard), "workers")
    return int(await redis.xlen(stream(shard))), int(pending["pending"])


async def test_entries_that_name_no_job_are_dropped_by_the_reads_that_meet_them(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No `g`, or a `g` that is no generation id: acknowledged, deleted, logged.

    Two come before a job in its shard's stream (the one-script read meets
    them), one sits alone in another shard (the read of every shard in turn).
    """
    person = await studio()
    shard = shard_of((await sign_in(person, mail_server))["id"])
    other = (shard + 1) % 16
    queue = JobQueue(redis)
    await queue.ensure_group()
    await redis.xadd(stream(shard), {"x": "written by hand"})
    await redis.xadd(stream(shard), {"g": "not an id!"})
    gid = await _submit(person)
    await redis.xadd(stream(other), {"g": b"\xff\xfe"})
    taken: list[tuple[str, str]] = []
    for _ in range(4):  # each read of one job meets one stray first
        taken += (await queue.read("reader", 1)).jobs
    assert [g for _, g in taken] == [gid]
    assert await _strays_left(redis, shard) == (1, 1)  # the job's own entry
    assert (await queue.read("reader", 16)).jobs == []  # every shard in turn
    assert await _strays_left(redis, other) == (0, 0)
    assert "dropped 1 stream entries that name no job" in caplog.text


async def test_a_take_over_drops_a_dead_workers_entry_that_names_no_job(
    redis: Redis,
) -> None:
    """XAUTOCLAIM hands it over: the worker taking over goes on without it."""
    queue = JobQueue(redis)
    await queue.ensure_group()
    await redis.xadd(stream(3), {"x": "1"})
    await redis.xreadgroup("workers", "dead", {stream(3): ">"}, count=1)
    assert await _strays_left(redis, 3) == (1, 1)
    assert await queue.reclaim("alive", 0, 8) == []
    assert await _strays_left(redis, 3) == (0, 0)
