"""Memory of the shipped `serve` under mixed requests and `worker` over demo jobs.

Starts what ships, `python -m service serve` and `python -m service worker`,
with their default settings plus what the load needs (bench/jobs.py's: the
demo upstream at zero seconds, credits and sign-in limits for the bench
accounts), and samples each process's resident memory (VmRSS, /proc) while:
- `serve` answers --requests (100,000) mixed requests on loopback: the
  documents (HTML and Markdown), /llms.txt, /api/square, /api/models and
  /healthz, from 64 clients on as many loopback addresses and connections
  (the square's per-address limit, at its default, refuses some: 429s are
  part of the mix);
- `worker` runs --jobs (1,000) demo jobs submitted through `serve`, every
  --video-every'th one a video (PyAV encodes it), the rest images.
Both run as the image runs them: PYTHONOPTIMIZE=2 (no docstrings or
asserts), with bytecode compiled for that level first, as the Dockerfile
does. Beside it, the baseline: the same `serve` load on a plain
`python -m service serve` (no optimization), in the same run.
It prints each one's RSS after start-up and after its load, the medians of
the samples taken in each half of the load (their difference is the growth)
and the peak, beside the targets (serve <= 60 MB, worker <= 150 MB after the
load, no growth).
Usage: python bench/memory.py [--requests 100000] [--jobs 1000] [--video-every 10]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import itertools
import os
import re
import statistics
import subprocess
import sysconfig
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
from jobs import ROOT, healthy, sign_in, start, studio_environ
from redis.asyncio import Redis

from service.store.embedded import MailCatcher, RedisServer, free_port
from service.studio.queue import JobQueue

SERVE_TARGET_MB = 60
WORKER_TARGET_MB = 150
# One round of the mix: documents (a quarter of them as Markdown), the
# machine files, the square (a quarter of all), the models and /healthz.
MIX = [
    ("/", None),
    ("/en", None),
    ("/api/square", None),
    ("/api/models", None),
    ("/terms", "text/markdown"),
    ("/healthz", None),
    ("/api/square", None),
    ("/llms.txt", None),
]
# 64 clients, each on its own loopback address and kept-alive connection.
SOURCES = [f"127.0.1.{n}" for n in range(1, 65)]
ACCOUNTS = 10
# The image's interpreter setting (Dockerfile), and the plain baseline.
AS_THE_IMAGE = "2"
PLAIN = "0"
TESTS = re.compile(r"/(tests?|idle_test)/")
IMAGE = {"model": "seedream-4", "prompt": "a lamp on a desk"}
VIDEO = {"model": "kling-2-1", "prompt": "a lamp on a desk, slowly turning"}


def rss_mb(pid: int) -> float:
    """Return a process's resident set size in MB (MiB)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) / 1024


class Samples:
    """RSS read every 0.2 s while a load runs, each tagged with its progress."""

    def __init__(self, pid: int, progress: Callable[[], Awaitable[float]]) -> None:
        self.pid = pid
        self.start = rss_mb(pid)
        self.taken: list[tuple[float, float]] = []  # (fraction done, MB)
        self._progress = progress

    async def run(self) -> None:
        """Sample until the load is done."""
        while True:
            done = await self._progress()
            self.taken.append((done, rss_mb(self.pid)))
            if done >= 1:
                return
            await asyncio.sleep(0.2)

    def line(self, name: str, target: int) -> str:
        """Medians of each half, the peak, and the figure after the load."""
        end = rss_mb(self.pid)
        first = statistics.median(mb for done, mb in self.taken if done < 0.5)
        second = statistics.median(mb for done, mb in self.taken if done >= 0.5)
        peak = max(mb for _, mb in self.taken)
        verdict = "ok" if end <= target else "OVER"
        return (
            f"{name:6} RSS after start-up {self.start:5.1f} MB, after the load"
            f" {end:5.1f} MB (target <= {target}: {verdict}); median first half"
            f" {first:5.1f}, second half {second:5.1f} (growth {second - first:+.1f}"
            f" MB); peak {peak:5.1f}"
        )


async def _requests(url: str, total: int, pid: int) -> Samples:
    """Send `total` mixed requests while sampling `serve`."""
    sessions = [
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(source, 0), limit=1)
        )
        for source in SOURCES
    ]
    counter = itertools.count()
    statuses: Counter[int] = Counter()

    async def progress() -> float:
        return sum(statuses.values()) / total

    async def client(session: aiohttp.ClientSession) -> None:
        while (number := next(counter)) < total:
            path, accept = MIX[number % len(MIX)]
            headers = {"Accept": accept} if accept else {}
            async with session.get(url + path, headers=headers) as response:
                await response.read()
                statuses[response.status] += 1

    samples = Samples(pid, progress)
    try:
        await asyncio.gather(samples.run(), *map(client, sessions))
    finally:
        for session in sessions:
            await session.close()
    print(f"  answers: {dict(sorted(statuses.items()))}")
    return samples


async def _jobs(
    url: str, mail: MailCatcher, redis_url: str, args: argparse.Namespace, pid: int
) -> Samples:
    """Submit the jobs through `serve` while sampling the (started) worker."""
    sessions = [await sign_in(url, mail, index) for index in range(ACCOUNTS)]
    redis = Redis.from_url(redis_url)
    queue = JobQueue(redis)
    submitted = 0

    async def progress() -> float:
        left: int = await queue.depth()
        return (submitted - left) / int(args.jobs)

    async def submit() -> None:
        nonlocal submitted
        for number in range(args.jobs):
            video = (number + 1) % args.video_every == 0
            body = VIDEO if video else {**IMAGE, "seed": number}
            session = sessions[number % len(sessions)]
            async with session.post(f"{url}/api/generations", json=body) as answer:
                if answer.status != 202:
                    raise RuntimeError(f"submit: {answer.status} {await answer.text()}")
            submitted += 1

    samples = Samples(pid, progress)  # the idle worker's figure first
    try:
        await asyncio.gather(submit(), samples.run())
    finally:
        await redis.aclose()
        for session in sessions:
            await session.close()
    await asyncio.sleep(1)  # the last job's settlement
    return samples


def compile_for_the_image() -> None:
    """Compile bytecode at the image's level, as its build does (once; kept)."""
    paths = {sysconfig.get_path(name) for name in ("stdlib", "purelib", "platlib")}
    for path in [*sorted(paths), str(ROOT / "service")]:
        # Test directories are imported by nobody (the image has none), and
        # the standard library's hold files written not to compile.
        compileall.compile_dir(path, quiet=2, workers=0, optimize=2, rx=TESTS)


def at_level(environ: dict[str, str], optimize: str) -> dict[str, str]:
    """The same settings, for a process run at an optimization level."""
    return environ | {"PYTHONOPTIMIZE": optimize}


async def _serve_load(
    args: argparse.Namespace, environ: dict[str, str], optimize: str
) -> tuple[str, subprocess.Popen[bytes]]:
    """Start `serve` at an optimization level, load it, and return its line."""
    url = environ["STUDIO_BASE_URL"]
    serve = start(["-m", "service", "serve"], at_level(environ, optimize), 0)
    try:
        await healthy(url)
        mode = "as the image runs it" if optimize == AS_THE_IMAGE else "plain"
        print(f"serve ({mode}, PYTHONOPTIMIZE={optimize}): {args.requests} requests")
        started = time.monotonic()
        served = await _requests(url, args.requests, serve.pid)
        seconds = time.monotonic() - started
        print(f"  {args.requests / seconds:.0f} req/s")
    except BaseException:
        serve.terminate()
        serve.wait(timeout=30)
        raise
    name = "serve" if optimize == AS_THE_IMAGE else "plain"
    return served.line(name, SERVE_TARGET_MB), serve


async def _run(args: argparse.Namespace) -> None:
    compile_for_the_image()
    with (
        tempfile.TemporaryDirectory() as scratch,
        RedisServer(data_dir=Path(scratch) / "redis") as redis,
        MailCatcher() as mail,
    ):
        media = Path(scratch) / "media"
        plain_line, plain = await _serve_load(
            args, studio_environ(redis.url, mail, media, free_port()), PLAIN
        )
        plain.terminate()
        plain.wait(timeout=30)
        environ = studio_environ(redis.url, mail, media, free_port())
        url = environ["STUDIO_BASE_URL"]
        serve_line, serve = await _serve_load(args, environ, AS_THE_IMAGE)
        worker = None
        try:
            videos = args.jobs // args.video_every
            print(f"worker: {args.jobs} demo jobs, {videos} of them videos")
            worker = start(
                ["-m", "service", "worker"], at_level(environ, AS_THE_IMAGE), 1
            )
            await asyncio.sleep(3)  # its start-up, before the first sample
            drained = await _jobs(url, mail, redis.url, args, worker.pid)
            worker_line = drained.line("worker", WORKER_TARGET_MB)
            after_submits = rss_mb(serve.pid)
        finally:
            for process in (worker, serve):
                if process is not None:
                    process.terminate()
                    process.wait(timeout=30)
    print("load average {:.2f} {:.2f} {:.2f}".format(*os.getloadavg()))
    print(plain_line)
    print(serve_line)
    print(f"       (and after the {args.jobs} submits too: {after_submits:.1f} MB)")
    print(worker_line)


def main() -> None:
    """Run both loads and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--video-every", type=int, default=10)
    args = parser.parse_args()
    asyncio.run(_run(args))


if __name__ == "__main__":
    main()
