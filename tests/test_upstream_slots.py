"""Per-upstream slots across the fleet: a Redis semaphore whose leases expire.

Real Redis, real worker objects and real child processes: many holders never
exceed the limit, a SIGKILLed holder's slot comes back after its lease, a job
waits for a slot (and fails TIMED_OUT, refunded, if none frees before its
deadline), and the same script runs on Redis Cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Final

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from service.app import create_app
from service.content import load_content
from service.settings import ROOT, load_settings
from service.store.connect import connect
from service.store.embedded import MailCatcher, RedisServer
from service.studio.media.store import DirectoryStore
from service.studio.upstreams.base import Output, Progress, Request, Upstream
from service.studio.upstreams.registry import Upstreams
from service.studio.upstreams.slots import UpstreamSlots, slots_key
from service.studio.worker import Worker

from .cluster import Cluster
from .conftest import Client, Env, MakeClient, SettingsFactory
from .processes import studio_environ
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process

CONTENT: Final = load_content()
MODEL: Final = CONTENT.models[0].id
UPSTREAM: Final = CONTENT.models[0].upstream
# A child that holds one slot of "vendor" (limit 1, lease 1 s) until killed.
_HOLDER: Final = """
import asyncio, sys
from service.store.connect import connect
from service.studio.upstreams.slots import UpstreamSlots

async def main() -> None:
    redis = connect(sys.argv[1], cluster=False, socket_timeout=5, connect_timeout=5)
    slots = UpstreamSlots(redis, "vendor", 1, lease=1.0)
    async with slots.held():
        print("held", flush=True)
        await asyncio.sleep(3600)

asyncio.run(main())
"""
# A child that takes a slot of "vendor" (limit 2) five times, counting holders.
_COUNTER: Final = """
import asyncio, random, sys
from service.store.connect import connect
from service.studio.upstreams.slots import UpstreamSlots

async def main() -> None:
    redis = connect(sys.argv[1], cluster=False, socket_timeout=5, connect_timeout=5)
    slots = UpstreamSlots(redis, "vendor", 2, lease=5.0)
    for _ in range(5):
        async with slots.held():
            await redis.rpush("test:seen", await redis.incr("test:inside"))
            await asyncio.sleep(random.uniform(0.01, 0.05))
            await redis.decr("test:inside")

asyncio.run(main())
"""


async def test_many_holders_on_their_own_connections_never_exceed_the_limit(
    redis_server: RedisServer, redis: Redis
) -> None:
    """Twelve coroutines, three slots: at most three inside at once, all served."""
    inside, most, served = 0, 0, 0

    async def holder() -> None:
        nonlocal inside, most, served
        client = connect(
            redis_server.url, cluster=False, socket_timeout=5, connect_timeout=5
        )
        slots = UpstreamSlots(client, "vendor", 3, lease=5.0)
        for _ in range(4):
            async with slots.held():
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(random.uniform(0.005, 0.03))
                inside -= 1
                served += 1
        await client.aclose()

    await asyncio.wait_for(asyncio.gather(*(holder() for _ in range(12))), 30)
    assert (most, served) == (3, 48)
    assert await redis.zcard(slots_key("vendor")) == 0  # every slot given back


def test_holders_in_separate_processes_never_exceed_the_limit(
    redis_server: RedisServer,
) -> None:
    """Four processes, two slots: the count Redis saw inside never passed two."""
    import redis as sync_redis

    client = sync_redis.Redis.from_url(redis_server.url)
    client.flushdb()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _COUNTER, redis_server.url],
            cwd=ROOT,
            env=studio_environ(),
        )
        for _ in range(4)
    ]
    assert [child.wait(timeout=60) for child in children] == [0] * 4
    seen = [int(n) for n in client.lrange("test:seen", 0, -1)]
    client.close()
    assert len(seen) == 20
    assert max(seen) == 2


@pytest.fixture
def holder(redis_server: RedisServer, redis: Redis) -> Iterator[subprocess.Popen[str]]:
    """A child process holding the only slot of "vendor"."""
    child = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, redis_server.url],
        cwd=ROOT,
        env=studio_environ(),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "held"
    yield child
    if child.poll() is None:
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    child.stdout.close()


async def test_a_sigkilled_holders_slot_comes_back_after_its_lease(
    holder: subprocess.Popen[str], redis: Redis
) -> None:
    """Held while its process lives and renews; free about a lease after SIGKILL."""
    slots = UpstreamSlots(redis, "vendor", 1, lease=1.0)
    await asyncio.sleep(1.5)  # past one lease: the holder's renewals keep it
    assert not await slots.take("me")
    os.killpg(holder.pid, signal.SIGKILL)
    holder.wait()
    killed = time.monotonic()
    assert not await slots.take("me")
    await asyncio.wait_for(slots.wait("me"), 5)
    assert 0.1 < time.monotonic() - killed < 2.0
    assert await redis.zrange(slots_key("vendor"), 0, -1) == [b"me"]


async def test_a_waiting_holder_gets_the_slot_as_soon_as_it_is_given_back(
    redis: Redis,
) -> None:
    """Waiting is not failing: the second holder runs once the first is done."""
    slots = UpstreamSlots(redis, "vendor", 1, lease=30.0)
    order: list[str] = []

    async def use(name: str, seconds: float) -> None:
        async with slots.held():
            order.append(f"{name} in")
            await asyncio.sleep(seconds)
            order.append(f"{name} out")

    first = asyncio.create_task(use("first", 0.3))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(use("second", 0.0), 5)
    await first
    assert order == ["first in", "first out", "second in", "second out"]


async def test_a_wait_cancelled_by_its_deadline_leaves_no_slot_behind(
    redis: Redis,
) -> None:
    """A holder whose deadline passes while waiting holds nothing afterwards."""
    slots = UpstreamSlots(redis, "vendor", 1, lease=30.0)
    assert await slots.take("someone")

    async def enter() -> None:
        async with slots.held():
            raise AssertionError("no slot was free")

    with pytest.raises(TimeoutError):
        await asyncio.wait_for(enter(), 0.3)
    assert await redis.zrange(slots_key("vendor"), 0, -1) == [b"someone"]


def test_a_limit_below_one_or_a_lease_of_nothing_is_refused(redis: Redis) -> None:
    """0 means no limit to the worker, which then makes no slots at all."""
    for limit, lease in ((0, 1.0), (1, 0.0)):
        with pytest.raises(ValueError, match="limit"):
            UpstreamSlots(redis, "vendor", limit, lease=lease)


class Counting:
    """The demo upstream, counting how many calls are inside it at once."""

    def __init__(self, inner: Upstream) -> None:
        self.inner = inner
        self.inside = 0
        self.most = 0

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Run the demo job while counting it."""
        self.inside += 1
        self.most = max(self.most, self.inside)
        try:
            return await self.inner.generate(request, progress)
        finally:
            self.inside -= 1

    async def aclose(self) -> None:
        """Close the demo upstream."""
        await self.inner.aclose()


@pytest.fixture
def studio_env(tmp_path: Path, redis_server: RedisServer) -> Env:
    """The demo upstream (0.3 s a job) and one media directory."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.3",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_WORKER_CONCURRENCY": "4",
    }


@pytest.fixture
def signed_in(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    redis: Redis,
    mail_server: MailCatcher,
) -> MakeClient:
    """Build a signed-in client on the real app (with extra settings)."""

    async def factory(**extra: str) -> Client:
        settings = make_settings(**{**studio_env, **extra})
        client = await aiohttp_client(create_app(settings))
        await sign_in(client, mail_server)
        return client

    return factory


async def _submit(client: Client) -> str:
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp"}
    )
    assert response.status == 202, await response.text()
    gid: str = (await response.json())["id"]
    return gid


@contextlib.asynccontextmanager
async def running_workers(
    redis: Redis, env: Env, count: int
) -> AsyncIterator[Counting]:
    """Run `count` workers in this process, one slot for the model's upstream."""
    workbench = load_settings(env).workbench
    upstreams = Upstreams(workbench)
    counting = Counting(upstreams(CONTENT.models[0]))
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(
            Worker(
                redis=redis,
                content=CONTENT,
                settings=workbench,
                media=DirectoryStore(workbench.media_dir),
                upstream_for=lambda model: counting,
                in_flight={UPSTREAM: 1},
            ).run(stop)
        )
        for _ in range(count)
    ]
    try:
        yield counting
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await upstreams.aclose()


async def test_workers_take_turns_on_an_upstream_with_one_slot(
    signed_in: MakeClient, redis: Redis, studio_env: Env
) -> None:
    """Two workers that could run eight jobs, one slot: one call at a time."""
    client = await signed_in()
    gids = [await _submit(client) for _ in range(4)]
    async with running_workers(redis, studio_env, 2) as counting:
        for gid in gids:
            body = await wait_for_status(client, gid, {"succeeded", "failed"}, 30)
            assert body["status"] == "succeeded"
    assert counting.most == 1


async def test_a_job_waits_for_a_slot_until_its_deadline_then_is_refunded(
    signed_in: MakeClient, redis: Redis, studio_env: Env
) -> None:
    """Nobody gives the slot back: the job calls nothing, fails TIMED_OUT, refunded."""
    client = await signed_in(STUDIO_JOBS_IMAGE_DEADLINE="3")
    squatter = UpstreamSlots(redis, UPSTREAM, 1, lease=60.0)
    assert await squatter.take("another-worker")
    # The deadline runs from the submit: the worker starts first, and the check
    # at one second has two seconds to spare on a busy machine (the soak once
    # found the job already failed there, with a 2 s deadline and the worker
    # started after the submit).
    async with running_workers(redis, studio_env, 1) as counting:
        gid = await _submit(client)
        await asyncio.sleep(1.0)
        body = await (await client.get(f"/api/generations/{gid}")).json()
        assert body["status"] == "running"  # waiting, not failed
        body = await wait_for_status(client, gid, {"succeeded", "failed"}, 20)
    assert (body["status"], body["error"], body["refunded"]) == (
        "failed",
        "TIMED_OUT",
        True,
    )
    assert counting.most == 0
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]
    assert await balance(client) == 100


async def test_worker_processes_keep_the_max_in_flight_setting(
    signed_in: MakeClient, redis: Redis, studio_env: Env
) -> None:
    """Two `studio worker` processes, STUDIO_UPSTREAMS_<NAME>_MAX_IN_FLIGHT=1."""
    client = await signed_in()
    gids = [await _submit(client) for _ in range(3)]
    variable = f"STUDIO_UPSTREAMS_{UPSTREAM.upper()}_MAX_IN_FLIGHT"
    holders: list[int] = []

    async def sample() -> None:
        while True:
            holders.append(await redis.zcard(slots_key(UPSTREAM)))
            await asyncio.sleep(0.02)

    with (
        worker_process({**studio_env, variable: "1"}),
        worker_process({**studio_env, variable: "1"}),
    ):
        sampler = asyncio.create_task(sample())
        for gid in gids:
            await wait_for_status(client, gid, {"succeeded", "failed"}, 60)
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
    assert max(holders) == 1
    for gid in gids:
        body = await (await client.get(f"/api/generations/{gid}")).json()
        assert body["status"] == "succeeded"


async def test_the_slots_script_keeps_the_limit_on_redis_cluster(
    cluster: Cluster,
) -> None:
    """One key, one script: the cluster client routes it to the key's master."""
    client: Any = connect(
        cluster.url, cluster=True, socket_timeout=10, connect_timeout=5
    )
    try:
        # A cluster formed a moment ago can drop a first connection to a node
        # (seen once in CI): wait until the key's master answers, then measure.
        deadline = time.monotonic() + 10
        while True:
            try:
                await client.zcard(slots_key("vendor"))
                break
            except RedisConnectionError:
                assert time.monotonic() < deadline, "the cluster never answered"
                await asyncio.sleep(0.2)
        slots = UpstreamSlots(client, "vendor", 2, lease=5.0)
        inside, most = 0, 0

        async def hold() -> None:
            nonlocal inside, most
            async with slots.held():
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0.02)
                inside -= 1

        await asyncio.wait_for(asyncio.gather(*(hold() for _ in range(8))), 30)
        assert most == 2
        assert await client.zcard(slots_key("vendor")) == 0
    finally:
        await client.aclose()
