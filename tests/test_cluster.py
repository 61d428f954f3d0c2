"""The service on Redis Cluster: 3 masters with a replica each, through the real app.

Sign-in with real SMTP, sessions, the limiter, credits, generations on a real
worker process and the square, then a master SIGKILLed under an account's
ledger: its replica takes over and no acknowledged ledger entry is lost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from service.app import create_app
from service.limits.limiter import GCRA_BATCH_SCRIPT, Limiter, Policy, bucket_key
from service.settings import SettingsError, load_settings
from service.store.cancel_safe import CancelSafeConnection
from service.store.connect import connect, is_cluster, warm
from service.store.embedded import MailCatcher
from service.studio.ledger import account_key
from service.studio.queue import (
    SHARDS,
    TAGS,
    JobQueue,
    new_account_id,
    prefix,
    shard_of,
    stream,
)

from .cluster import Cluster
from .conftest import (
    TEST_SECRET,
    Client,
    Env,
    MakeClient,
    SettingsFactory,
    forget_limits,
)
from .processes import studio_environ
from .workbench import (
    balance,
    ledger,
    sign_in,
    studio_command,
    wait_for_status,
    worker_process,
)


@pytest.fixture
async def cluster_redis(cluster: Cluster) -> AsyncIterator[Redis]:
    """A cluster client of the test's own, made by the service's factory."""
    client = connect(cluster.url, cluster=True, socket_timeout=2, connect_timeout=1)
    yield client
    await client.aclose()


async def test_every_node_of_the_cluster_sends_with_cancel_safe_connections(
    cluster_redis: Redis,
) -> None:
    """The nodes the client finds after start-up are made cancel-safe too."""
    await cluster_redis.ping()
    client = cast(RedisCluster, cluster_redis)
    nodes = client.get_nodes()  # three masters, more once a failover has been
    assert len(nodes) >= 3
    assert {node.connection_class for node in nodes} == {CancelSafeConnection}


@pytest.fixture
def cluster_env(tmp_path: Path, cluster: Cluster, mail_server: MailCatcher) -> Env:
    """Settings shared by the app, its workers and operator commands."""
    return {
        "STUDIO_REDIS_URL": cluster.url,
        "STUDIO_REDIS_WAIT_REPLICAS": "1",
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_SMTP_HOST": mail_server.host,
        "STUDIO_SMTP_PORT": str(mail_server.port),
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.2",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_JOBS_VISIBILITY_TIMEOUT": "2",
    }


@pytest.fixture
def studio(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, cluster_env: Env
) -> MakeClient:
    """Build a client on the real app, configured for the cluster."""

    async def factory(**extra: str) -> Client:
        settings = make_settings(**{**cluster_env, **extra})
        assert settings.redis_cluster
        return await aiohttp_client(create_app(settings))

    return factory


async def _submit(client: Client, prompt: str = "a lamp") -> dict[str, Any]:
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": prompt}
    )
    assert response.status == 202, await response.text()
    generation: dict[str, Any] = await response.json()
    return generation


async def test_on_the_cluster_a_read_drops_entries_that_name_no_job(
    cluster_redis: Redis,
) -> None:
    """The per-shard reads (one pipeline per node) acknowledge and delete them."""
    queue = JobQueue(cluster_redis)
    await queue.ensure_group()
    strays = [0, 5, SHARDS - 1]  # on different masters
    for shard in strays:
        await cluster_redis.xadd(stream(shard), {"x": "written by hand"})
    assert (await queue.read("reader", SHARDS)).jobs == []
    for shard in strays:
        assert await cluster_redis.xlen(stream(shard)) == 0
        pending = await cluster_redis.xpending(stream(shard), "workers")
        assert pending["pending"] == 0


async def test_a_cluster_url_or_the_flag_selects_the_cluster_client() -> None:
    """redis+cluster:// (several seeds) or STUDIO_REDIS_CLUSTER=1; never a socket."""
    by_url = load_settings({"STUDIO_REDIS_URL": "redis+cluster://10.0.0.1:7000,h2"})
    by_flag = load_settings(
        {"STUDIO_REDIS_URL": "redis://h:7000/0", "STUDIO_REDIS_CLUSTER": "1"}
    )
    plain = load_settings({"STUDIO_REDIS_URL": "redis://h:7000/0"})
    assert (by_url.redis_cluster, by_flag.redis_cluster) == (True, True)
    assert not plain.redis_cluster
    client = connect(
        by_url.redis_url, cluster=True, socket_timeout=1, connect_timeout=1
    )
    assert is_cluster(client)
    seeds = cast(RedisCluster, client).startup_nodes
    assert [node.name for node in seeds] == ["10.0.0.1:7000", "h2:6379"]
    await client.aclose()
    with pytest.raises(SettingsError, match="STUDIO_REDIS_CLUSTER"):
        load_settings(
            {"STUDIO_REDIS_URL": "unix:///tmp/r.sock", "STUDIO_REDIS_CLUSTER": "1"}
        )


def test_new_account_ids_share_a_slot_with_their_queue_shard() -> None:
    """Submit debits the account and enqueues its job in one slot: one script."""
    spans = sorted(key_slot(tag.encode()) * SHARDS // 16384 for tag in TAGS)
    assert spans == list(range(SHARDS))  # one shard per 1/16 of the slots
    for _ in range(50):
        account = new_account_id()
        assert len(account) == 24
        slot = key_slot(account_key(account).encode())
        assert key_slot(prefix(shard_of(account)).encode()) == slot


async def test_sign_in_sessions_and_limits_work_on_the_cluster(
    studio: MakeClient, mail_server: MailCatcher, cluster_redis: Redis
) -> None:
    """A code by real mail, a session cookie, sign-out, and a 429 from the limiter."""
    await forget_limits(cluster_redis)
    client = await studio(
        STUDIO_LIMITS_GALLERY_QUOTA="10", STUDIO_LIMITS_GALLERY_BURST="5"
    )
    user = await sign_in(client, mail_server)
    me = await client.get("/api/me")
    assert me.status == 200
    assert (await me.json())["id"] == user["id"]
    statuses = [(await client.get("/api/square")).status for _ in range(6)]
    assert statuses == [200] * 5 + [429]
    assert (await client.post("/api/auth/logout")).status == 204
    assert (await client.get("/api/me")).status == 401


async def test_a_turns_decisions_on_every_master_are_each_exact(
    cluster: Cluster,
) -> None:
    """One turn's calls, spread over the slots of all masters, batched per slot."""
    limiter = Limiter.from_url(cluster.url, cluster=True)
    policy = Policy("cluster", 3, 3600, 2)
    subjects = [f"test:spread{i}" for i in range(40)]
    masters = {cluster.primary_of(bucket_key(s, policy)).port for s in subjects}
    # As the app does at start-up: the slots learned and the script loaded, so
    # the first turn's 100 ms budget is not spent on them (a busy machine did).
    await warm(limiter.redis, (GCRA_BATCH_SCRIPT,))
    try:
        decisions = await asyncio.gather(
            *(limiter.check(s, [policy]) for s in subjects for _ in range(3))
        )
    finally:
        await limiter.aclose()
    assert len(masters) == 3
    for index, subject in enumerate(subjects):
        allowed = [d.allowed for d in decisions[3 * index : 3 * index + 3]]
        assert allowed == [True, True, False], subject


async def test_generations_credits_events_and_the_square_run_on_the_cluster(
    studio: MakeClient,
    mail_server: MailCatcher,
    cluster_env: Env,
    cluster: Cluster,
) -> None:
    """Accounts on every master submit; a worker process runs, settles and tells."""
    # Four accounts, more while they all sit on one master (1 run in 27 would).
    clients: list[Client] = []
    users: list[dict[str, Any]] = []
    masters: set[int] = set()
    while len(clients) < 4 or len(masters) < 2:
        assert len(clients) < 40, "new accounts never left one master"
        clients.append(await studio())
        users.append(await sign_in(clients[-1], mail_server))
        masters.add(cluster.primary_of(account_key(users[-1]["id"])).port)
    events: list[tuple[str, Any]] = []
    opened = asyncio.Event()

    async def listen() -> None:
        async with clients[0].get("/api/events") as response:
            assert response.status == 200
            name = ""
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    opened.set()
                    if name == "generation" and events[-1][1]["status"] in (
                        "succeeded",
                        "failed",
                    ):
                        return

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(opened.wait(), 10)
    generations = [await _submit(client) for client in clients]
    with worker_process(cluster_env):
        done = [
            await wait_for_status(client, g["id"], {"succeeded", "failed"})
            for client, g in zip(clients, generations, strict=True)
        ]
        await asyncio.wait_for(listener, 30)
    assert [g["status"] for g in done] == ["succeeded"] * len(clients)
    assert ("credits", {"balance": 94}) in events
    for client in clients:
        assert [e["kind"] for e in await ledger(client)] == ["grant", "debit"]
        assert await balance(client) == 94
    # the square: publish on one account, see it anonymously, take it down
    work = done[0]["works"][0]
    published = await clients[0].post(f"/api/works/{work['id']}/publish")
    assert published.status == 200, await published.text()
    square = await (await clients[1].get("/api/square")).json()
    assert work["id"] in [item["id"] for item in square["items"]]
    unpublished = await clients[0].delete(f"/api/works/{work['id']}/publish")
    assert unpublished.status == 200
    square = await (await clients[1].get("/api/square")).json()
    assert work["id"] not in [item["id"] for item in square["items"]]
    # an operator command goes through the same client factory
    granted = await studio_command(
        "credits", "grant", users[1]["email"], "5",
        environ=studio_environ(**cluster_env),
    )  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    assert await balance(clients[1]) == 99


async def test_money_moving_scripts_wait_for_a_replica(
    studio: MakeClient, mail_server: MailCatcher, cluster: Cluster
) -> None:
    """With redis_wait_replicas = 1 a submit is followed by WAIT on its master."""
    client = await studio()
    user = await sign_in(client, mail_server)
    master = cluster.primary_of(account_key(user["id"]))

    def waits() -> int:
        with master.client() as direct:
            stats = direct.info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))

    await _submit(client)  # loads the script on that master (NOSCRIPT, then again)
    before = waits()
    await _submit(client)
    assert waits() == before + 1
    quiet = await studio(STUDIO_REDIS_WAIT_REPLICAS="0")
    await sign_in(quiet, mail_server)
    before = waits()
    await _submit(quiet)
    assert waits() == before


async def _until_ok(client: Client, path: str, within: float = 20.0) -> Any:
    """GET until it answers 200 (503 while the cluster elects a new master)."""
    deadline = time.monotonic() + within
    while True:
        response = await client.get(path)
        if response.status == 200:
            return await response.json()
        assert response.status == 503, await response.text()
        assert time.monotonic() < deadline, "the cluster did not recover"
        await asyncio.sleep(0.2)


async def test_a_master_failover_loses_no_acknowledged_ledger_entry(
    studio: MakeClient, mail_server: MailCatcher, cluster_env: Env, cluster: Cluster
) -> None:
    """SIGKILL the master of an account's slot mid-work; its replica has it all."""
    client = await studio()
    user = await sign_in(client, mail_server)
    key = account_key(user["id"])
    with worker_process(cluster_env):
        first = [await _submit(client, f"before {i}") for i in range(3)]
        await wait_for_status(client, first[0]["id"], {"succeeded"})  # worker is up
        acknowledged = await ledger(client)
        dead, successor = await asyncio.to_thread(cluster.fail_over, key)
        rejoined = False
        try:
            assert successor is not dead
            after = await _until_ok(client, "/api/credits?limit=50")
            kept = {entry["id"]: entry for entry in after["entries"]}
            for entry in acknowledged:
                assert kept.get(entry["id"]) == entry
            # the promoted replica has no replica of its own: no debit on it is
            # acknowledged (503) until the old master rejoins as its replica
            payload = {"model": "seedream-4", "prompt": "after"}
            again = {"Idempotency-Key": "after-the-failover"}
            refused = await client.post("/api/generations", json=payload, headers=again)
            assert refused.status == 503, await refused.text()
            assert await refused.json() == {"error": "UNAVAILABLE"}
            await asyncio.to_thread(cluster.rejoin, dead)
            rejoined = True
            # the service keeps going; the retry replays the debit, once
            retried = await client.post("/api/generations", json=payload, headers=again)
            assert retried.status == 200, await retried.text()
            later = await retried.json()  # 4 live: the per-user cap
            for generation in [*first, later]:
                body = await wait_for_status(client, generation["id"], {"succeeded"})
                assert body["refunded"] is False
        finally:
            if not rejoined:
                await asyncio.to_thread(cluster.rejoin, dead)
    entries = await ledger(client)
    assert [e["kind"] for e in entries] == ["grant"] + ["debit"] * 4
    assert sum(e["amount"] for e in entries) == await balance(client) == 76
