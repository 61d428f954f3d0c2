"""Generations: submit latency at 50 signed-in clients, and one worker's queue overhead.

Measures what ships: `python -m service serve` and `python -m service worker`
started as subprocesses with their default settings (plus the demo upstream at
zero seconds, generous sign-in limits for the 50 bench accounts, and credits
enough to submit), against a Redis with AOF on, as a deployment runs it.

Baselines, started in the same run on the same machine:
- submit: `bare-xadd`, an aiohttp handler that reads the JSON body and does one
  XADD (the least any queueing submit must do), 50 clients alike, both in a
  closed loop (each client submits again as soon as it is answered: the
  latency is 50 / throughput, a measure of the whole machine) and in an open
  loop (Poisson arrivals at --rate submits/s in all: the latency a person sees
  at that load);
- worker: `bare-group`, a consumer-group loop that reads 8 at a time and acks
  each entry (no work, no settlement): the queue mechanism's own ceiling; and
  `taskiq-redis`, the fastest Redis queue library measured here (its stream
  broker, consumer groups and acks as ours, one `taskiq worker` process with
  its default settings) running a task that does nothing.

Before they are canceled, the submits above are drained once by `queue-only`:
a process that does for each job what the worker's queue does and nothing else
(the shared read of up to 8, `take`, `finish`: no settlement, no media), so the
queue's own cost per job stands beside taskiq-redis's per no-op task, and what
a whole job adds to it shows apart.

The worker drains whole jobs: the submits above are first canceled through the
real endpoint (`POST /api/generations/cancel`; a job canceled before its turn
leaves the queue at once), then 400 are submitted and drained, each settled
twice in the account's script, its image (1024x1024 from the demo) labeled as
the law asks (the visible mark, the TC260 metadata read back) and given a WebP
thumbnail. Each drain prints its rate and its process's CPU per job, all of it
and its event loop's thread alone (the pixels are made in executor threads), so
the queue's own cost per job stands beside taskiq-redis's per no-op task.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from harness import SECRET, pinned
from redis.asyncio import Redis

from service.store.embedded import MailCatcher, RedisServer, free_port
from service.studio.queue import JobQueue
from service.worker_command import worker_redis

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
CLIENTS = 50
# _drain_rate's name for the service's own queue (every shard's deadlines).
QUEUED = "studio:jobs"
PROMPT, SEED = "a lamp on a desk", 1
BODY = {"model": "seedream-4", "prompt": PROMPT, "seed": SEED}


TASKIQ_STREAM = "bench:taskiq"
TASKIQ_TASKS = 10_000
# Whole jobs per client: 50 x 8 = 400 images labeled (about 40 ms of CPU each).
WHOLE_PER_CLIENT = 8


def taskiq_broker(url: str) -> Any:
    """taskiq-redis's stream broker with its defaults, and a task that does nothing."""
    from taskiq_redis import RedisStreamBroker

    broker = RedisStreamBroker(
        url, queue_name=TASKIQ_STREAM, consumer_group_name="bench", consumer_id="0"
    )

    @broker.task(task_name="noop")
    async def noop() -> None:
        return None

    return broker


# `taskiq worker jobs:broker` imports this module with the broker's Redis set.
if os.environ.get("BENCH_TASKIQ_REDIS"):
    broker = taskiq_broker(os.environ["BENCH_TASKIQ_REDIS"])


def studio_environ(
    redis_url: str, mail: MailCatcher, media: Path, port: int
) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_")}
    return environ | {
        "STUDIO_REDIS_URL": redis_url,
        "STUDIO_SECRET_KEY": SECRET,
        "STUDIO_PORT": str(port),
        "STUDIO_BASE_URL": f"http://127.0.0.1:{port}",
        "STUDIO_SMTP_HOST": mail.host,
        "STUDIO_SMTP_PORT": str(mail.port),
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0",
        "STUDIO_MEDIA_DIR": str(media),
        "STUDIO_TRIAL_CREDITS": "1000000",
        "STUDIO_JOBS_PER_USER": "1000",
        "STUDIO_LIMITS_CODE_IP_QUOTA": "100000",
        "STUDIO_LIMITS_CODE_IP_BURST": "50000",
        "STUDIO_LIMITS_VERIFY_IP_QUOTA": "100000",
        "STUDIO_LIMITS_VERIFY_IP_BURST": "50000",
        # 50 sign-ins from one address: no proof-of-work challenge
        "STUDIO_LIMITS_CODE_NET_QUOTA": "100000",
        "STUDIO_LIMITS_CODE_NET_BURST": "50000",
        "STUDIO_LIMITS_CODE_NET_FREE_QUOTA": "100000",
        "STUDIO_LIMITS_CODE_NET_FREE_BURST": "50000",
    }


def start(
    args: list[str], environ: dict[str, str], cpu: int, cwd: Path = ROOT
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        pinned(cpu, [sys.executable, *args]),
        cwd=cwd,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=None if os.environ.get("BENCH_VERBOSE") else subprocess.DEVNULL,
    )


async def healthy(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.get(f"{url}/healthz") as response:
                    if response.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise RuntimeError(f"{url} did not start")


async def sign_in(url: str, mail: MailCatcher, index: int) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    email = f"bench{index}@example.com"
    async with session.post(f"{url}/api/auth/code", json={"email": email}) as r:
        assert r.status == 200, await r.text()
    message = next(m for m in reversed(mail.messages) if m["To"] == email)
    text = message.get_body(preferencelist=("plain",)).get_content()
    code = next(w for w in text.split() if w.isdigit() and len(w) == 4)
    code += text.split(code, 1)[1].split()[0]
    async with session.post(
        f"{url}/api/auth/verify", json={"email": email, "code": code}
    ) as r:
        assert r.status == 200, await r.text()
    return session


async def _submit_latencies(
    url: str, sessions: list[aiohttp.ClientSession], per_client: int
) -> list[float]:
    latencies: list[float] = []

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in range(per_client):
            started = time.perf_counter()
            async with session.post(f"{url}/api/generations", json=BODY) as r:
                await r.read()
                assert r.status == 202, r.status
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(client(s) for s in sessions))
    return latencies


async def _paced_latencies(
    url: str, sessions: list[aiohttp.ClientSession], rate: float, seconds: float
) -> list[float]:
    """Open loop: each client submits on its own Poisson clock, `rate` in all.

    A latency is counted from the moment the submit was due, so a client held
    up by a slow answer pays for it (no coordinated omission).
    """
    latencies: list[float] = []
    each = rate / len(sessions)

    async def client(session: aiohttp.ClientSession, seed: int) -> None:
        clock = random.Random(seed)
        due = time.perf_counter() + clock.expovariate(each)
        end = time.perf_counter() + seconds
        while due < end:
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            async with session.post(f"{url}/api/generations", json=BODY) as r:
                await r.read()
                assert r.status == 202, r.status
            latencies.append(time.perf_counter() - due)
            due += clock.expovariate(each)

    await asyncio.gather(*(client(s, i) for i, s in enumerate(sessions)))
    return latencies


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _percentiles(samples: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples, n=100)
    return cuts[49] * 1000, cuts[98] * 1000


async def _left(redis: Redis, key: str) -> int:
    """How many of a queue's jobs are not done yet."""
    if key == QUEUED:
        return await JobQueue(redis).depth()
    if key == TASKIQ_STREAM:  # taskiq acks but keeps entries: count unread + unacked
        (group,) = await redis.xinfo_groups(key)
        return int(group["lag"] or 0) + int(group["pending"])
    return int(await redis.xlen(key))


async def _cancel_queued(url: str, session: aiohttp.ClientSession) -> None:
    async with session.post(
        f"{url}/api/generations/cancel", json={"status": "queued"}
    ) as r:
        assert r.status == 200, await r.text()


@dataclass(frozen=True)
class Drained:
    """A drain's rate, and its process's CPU per job: all of it, and its loop's."""

    rate: float
    cpu: float
    loop_cpu: float


def _thread_cpu_seconds(pid: int, tid: int) -> float:
    """User + system CPU time one thread has used (the main thread: tid = pid)."""
    stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _drained(redis: Redis, key: str, total: int, pid: int) -> Drained:
    """Time a drain from its first finished job to its last, and its CPU.

    The CPU of the process, and of its event loop's thread, over the same
    window: start-up is not in it.
    """
    left = total
    while left == total:  # polling Redis: nothing here to wait on
        await asyncio.sleep(0.005)
        left = await _left(redis, key)
    first, done_at_first = time.perf_counter(), total - left
    used, loop_used = _cpu_seconds(pid), _thread_cpu_seconds(pid, pid)
    while left:
        await asyncio.sleep(0.01)
        left = await _left(redis, key)
    seconds, jobs = time.perf_counter() - first, total - done_at_first
    cpu, loop_cpu = _cpu_seconds(pid) - used, _thread_cpu_seconds(pid, pid) - loop_used
    return Drained(jobs / max(seconds, 1e-6), cpu / jobs, loop_cpu / jobs)


async def _drain_with_worker(
    redis: Redis, environ: dict[str, str], total: int
) -> Drained:
    """Start `python -m service worker` and time it through `total` jobs."""
    worker = start(["-m", "service", "worker"], environ, 1)
    try:
        return await _drained(redis, QUEUED, total, worker.pid)
    finally:
        worker.terminate()
        worker.wait()


async def _drain_queue_only(
    redis: Redis, environ: dict[str, str], total: int
) -> Drained:
    """Start the `queue-only` consumer and time it through `total` jobs."""
    url = environ["STUDIO_REDIS_URL"]
    consumer = start([__file__, "--drain-queue", url], environ, 1)
    try:
        return await _drained(redis, QUEUED, total, consumer.pid)
    finally:
        consumer.terminate()
        consumer.wait()


def _child(pid: int) -> int:
    """The process doing the work: `taskiq worker` runs its worker as a child."""
    for _ in range(200):
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.025)
    raise RuntimeError("taskiq started no worker process")


async def _taskiq_drain(redis_url: str, environ: dict[str, str]) -> Drained:
    """Kick TASKIQ_TASKS no-op tasks, then time one `taskiq worker` draining them."""
    broker = taskiq_broker(redis_url)
    await broker.startup()  # its consumer group, reading from the stream's start
    noop = broker.find_task("noop")
    assert noop is not None
    for _ in range(TASKIQ_TASKS // 100):
        await asyncio.gather(*(noop.kiq() for _ in range(100)))
    await broker.shutdown()
    redis = Redis.from_url(redis_url)
    command = ["-m", "taskiq", "worker", "jobs:broker", "--workers", "1"]
    worker = start(command, environ | {"BENCH_TASKIQ_REDIS": redis_url}, 1, cwd=HERE)
    try:
        return await _drained(redis, TASKIQ_STREAM, TASKIQ_TASKS, _child(worker.pid))
    finally:
        worker.terminate()
        worker.wait()
        await redis.aclose()


def _labeling_cpu(environ: dict[str, str]) -> float:
    """CPU seconds one demo image's labels and thumbnail take here (a median of 9)."""
    from service.settings import load_settings
    from service.studio.media.demo_art import render_image
    from service.studio.media.finishing import finish

    labels = load_settings(environ).workbench.labels  # as the worker has them
    image = render_image(PROMPT, SEED, 1024, 1024)
    times = []
    for n in range(9):
        used = time.process_time()
        finish(labels, image, "png", f"bench{n:016d}")
        times.append(time.process_time() - used)
    return statistics.median(times)


def serve_baseline(port: int, redis_url: str) -> None:
    """The `bare-xadd` submit baseline: read the body, XADD it, answer 202."""
    import uvloop

    redis = Redis.from_url(redis_url)

    async def submit(request: web.Request) -> web.Response:
        body = await request.read()
        entry = await redis.xadd("bench:bare:stream", {"b": body})
        return web.json_response({"id": str(entry)}, status=202)

    app = web.Application()
    app.router.add_post("/api/generations", submit)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    app.router.add_get("/healthz", healthz)
    web.run_app(app, host="127.0.0.1", port=port, loop=uvloop.new_event_loop(),
                access_log=None, print=None)  # fmt: skip


def drain_baseline(redis_url: str) -> None:
    """The `bare-group` worker baseline: read 8 at a time, ack each, no work."""
    import uvloop

    async def run() -> None:
        redis = Redis.from_url(redis_url)
        while True:
            reply: Any = await redis.xreadgroup(
                "g", "c", {"bench:bare:stream": ">"}, count=8, block=1000
            )
            if not reply:
                continue
            for _, entries in reply:
                for entry, _ in entries:
                    await redis.xack("bench:bare:stream", "g", entry)
                    await redis.xdel("bench:bare:stream", entry)

    uvloop.run(run())


def drain_queue_only(redis_url: str) -> None:
    """The `queue-only` consumer: the worker's queue operations on no-op jobs."""
    import uvloop

    async def noop(queue: JobQueue, entry: str, gid: str) -> None:
        await queue.take(entry, gid)
        await queue.finish(gid, entry)

    async def run() -> None:
        # Connected as `worker` connects: its scripts go out on the wire.
        queue = JobQueue(worker_redis(redis_url, cluster=False))
        await queue.ensure_group()
        while True:
            batch = await queue.read("queue-only", 8)
            if batch.jobs:
                await asyncio.gather(*(noop(queue, *job) for job in batch.jobs))
            elif batch.waiting:
                await asyncio.sleep(0.001)
            else:
                await queue.wait(1000)

    uvloop.run(run())


async def main(per_client: int, rate: float) -> None:
    with (
        tempfile.TemporaryDirectory() as scratch,
        RedisServer(data_dir=Path(scratch) / "redis") as redis_server,
        MailCatcher() as mail,
    ):
        redis = Redis.from_url(redis_server.url)
        ours_port, base_port = free_port(), free_port()
        environ = studio_environ(
            redis_server.url, mail, Path(scratch) / "media", ours_port
        )
        app = start(["-m", "service", "serve"], environ, 0)
        base = start(
            [__file__, "--serve-baseline", str(base_port), redis_server.url], environ, 0
        )
        ours_url, base_url = (
            f"http://127.0.0.1:{ours_port}",
            f"http://127.0.0.1:{base_port}",
        )
        try:
            await healthy(ours_url)
            await healthy(base_url)
            sessions = [await sign_in(ours_url, mail, i) for i in range(CLIENTS)]
            # warm both, then measure ours and the baseline in turn, twice
            await _submit_latencies(ours_url, sessions, 2)
            await _submit_latencies(base_url, sessions, 2)
            ours: list[float] = []
            bare: list[float] = []
            paced_ours: list[float] = []
            paced_bare: list[float] = []
            cpu = {"ours": 0.0, "bare": 0.0}
            for _ in range(2):
                used = _cpu_seconds(app.pid)
                ours += await _submit_latencies(ours_url, sessions, per_client)
                cpu["ours"] += _cpu_seconds(app.pid) - used
                used = _cpu_seconds(base.pid)
                bare += await _submit_latencies(base_url, sessions, per_client)
                cpu["bare"] += _cpu_seconds(base.pid) - used
                for url, into in ((ours_url, paced_ours), (base_url, paced_bare)):
                    into += await _paced_latencies(url, sessions, rate, 5.0)
            # Whole jobs: the demo at 0 s, each image labeled and thumbnailed.
            # The closed and paced submits above queue thousands: they are
            # canceled first (the real endpoint), which takes them out at once.
            # The queue alone drains them first; their records stay queued.
            queued = await JobQueue(redis).depth()
            queue_only = await _drain_queue_only(redis, environ, queued)
            for session in sessions:
                await _cancel_queued(ours_url, session)
            assert await JobQueue(redis).depth() == 0
            await _submit_latencies(ours_url, sessions, WHOLE_PER_CLIENT)
            whole = await JobQueue(redis).depth()
            drained = await _drain_with_worker(redis, environ, whole)
            for session in sessions:
                await session.close()
        finally:
            app.terminate()
            base.terminate()
            app.wait()
            base.wait()
        bare_queued = int(await redis.xlen("bench:bare:stream"))
        await redis.xgroup_create("bench:bare:stream", "g", id="0")
        drain = start([__file__, "--drain-baseline", redis_server.url], environ, 1)
        try:
            bare_drained = await _drained(
                redis, "bench:bare:stream", bare_queued, drain.pid
            )
        finally:
            drain.terminate()
            drain.wait()
        taskiq_drained = await _taskiq_drain(redis_server.url, environ)
        labeling = _labeling_cpu(environ)
        await redis.aclose()

    ours_p50, ours_p99 = _percentiles(ours)
    bare_p50, bare_p99 = _percentiles(bare)
    print(f"submit at {CLIENTS} signed-in clients ({len(ours)} requests each side)")
    print(f"  {'':24} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'ours (serve)':24} {ours_p50:8.2f} {ours_p99:8.2f}")
    print(f"  {'bare-xadd':24} {bare_p50:8.2f} {bare_p99:8.2f}")
    ratios = f"{ours_p50 / bare_p50:8.2f} {ours_p99 / bare_p99:8.2f}"
    print(f"  ratio ours/bare         {ratios}")
    ours_us, bare_us = (cpu[side] / len(ours) * 1e6 for side in ("ours", "bare"))
    print(
        f"  server CPU per submit: ours {ours_us:.0f} us, bare-xadd {bare_us:.0f} us"
        f" ({ours_us / bare_us:.2f}x)   target ours <= 200 us"
    )
    paced_p50, paced_p99 = _percentiles(paced_ours)
    pbare_p50, pbare_p99 = _percentiles(paced_bare)
    print(f"submit at {CLIENTS} clients, open loop at {rate:.0f} submits/s in all")
    print(
        f"  {'ours (serve)':24} {paced_p50:8.2f} {paced_p99:8.2f}   target p99 < 10 ms"
    )
    print(f"  {'bare-xadd':24} {pbare_p50:8.2f} {pbare_p99:8.2f}")
    ratios = f"{paced_p50 / pbare_p50:8.2f} {paced_p99 / pbare_p99:8.2f}"
    print(f"  ratio ours/bare         {ratios}")
    print(f"queue drain, one worker process each ({whole} whole jobs ours,")
    print(
        f"  {TASKIQ_TASKS} no-op tasks taskiq-redis, {bare_queued} entries bare-group)"
    )
    print(f"  {'':26} {'jobs/s':>8} {'CPU/job':>10} {'loop CPU/job':>13}")
    for name, row in (
        ("ours (worker, labeled)", drained),
        ("ours, queue only (no-op)", queue_only),
        ("taskiq-redis (no-op)", taskiq_drained),
        ("bare-group (no-op)", bare_drained),
    ):
        print(
            f"  {name:26} {row.rate:8.1f} {row.cpu * 1e3:8.2f}ms"
            f" {row.loop_cpu * 1e3:11.2f}ms"
        )
    ceiling = 1 / drained.loop_cpu
    print(
        f"  ours without the pixels: {ceiling:.0f} jobs/s (1 / its event loop's CPU"
        " per job: reads, takes, settles, acks, media writes)"
    )
    print(f"  ratio of that to taskiq-redis {ceiling / taskiq_drained.rate:8.3f}"
          "   target >= 1.1 (and >= 2000 jobs/s)")  # fmt: skip
    alone = queue_only.rate / taskiq_drained.rate
    by_cpu = taskiq_drained.loop_cpu / queue_only.loop_cpu
    print(
        f"  the queue alone against taskiq-redis: {queue_only.rate:.0f} against"
        f" {taskiq_drained.rate:.0f} jobs/s, {alone:.3f} (by loop CPU {by_cpu:.3f})"
    )
    # Timed apart from the drain, minutes later: on a VM whose speed drifts the
    # two may not add up, so both are shown rather than a share of one in the other.
    print(
        f"  labeling one demo image: {labeling * 1000:.1f} ms of CPU, timed alone"
        f" after the drains (a whole job in the drain: {drained.cpu * 1000:.1f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    # 4,000 submits a side: the CPU per submit is read from /proc's 10 ms ticks
    parser.add_argument("--per-client", type=int, default=40)
    parser.add_argument(
        "--rate", type=float, default=1000.0, help="open-loop submits/s, all clients"
    )
    parser.add_argument("--serve-baseline", nargs=2, metavar=("PORT", "REDIS"))
    parser.add_argument("--drain-baseline", metavar="REDIS")
    parser.add_argument("--drain-queue", metavar="REDIS")
    args = parser.parse_args()
    if args.serve_baseline:
        serve_baseline(int(args.serve_baseline[0]), args.serve_baseline[1])
    elif args.drain_baseline:
        drain_baseline(args.drain_baseline)
    elif args.drain_queue:
        drain_queue_only(args.drain_queue)
    else:
        asyncio.run(main(args.per_client, args.rate))
