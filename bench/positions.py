"""Queue positions: what `GET /api/generations` costs with places in line to count.

Measures what ships: `python -m service serve` started as a subprocess with its
default settings (plus the demo upstream and generous sign-in limits), against
a Redis holding 10,000 queued jobs in all (no worker runs, so they stay queued):
9,996 of them charged and enqueued by the real submit script for 2,499 other
accounts, and the 4 of the person asking, submitted through the API last (so
their places are 9,997 to 10,000).

Baseline, in the same run, on the same server: the same request by a second
person whose 4 generations were canceled, so the page has the same 4 items and
the same work but no place in line to count (`queue_position` and
`eta_seconds` null). Both are asked in turn, one request at a time, in
alternating blocks; p50 and p99 of each side and their ratios are printed.

Usage: python bench/positions.py [--requests 2000] [--block 200] [--queued 10000]
(--queued 100 shows the cost does not grow with the line.)
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import uvloop
from jobs import healthy, sign_in, start, studio_environ
from redis.asyncio import Redis

from service.store.embedded import MailCatcher, RedisServer, free_port
from service.studio.generations import GenerationStore
from service.studio.ledger import Ledger
from service.studio.queue import new_account_id

QUEUED_IN_ALL = 10_000
MINE = 4
BODY = {"model": "seedream-4", "prompt": "a lamp on a desk", "seed": 1}


async def fill_the_line(redis: Redis, jobs: int) -> None:
    """Charge and enqueue `jobs` generations for other accounts, 4 each."""
    ledger = Ledger(redis, trial_credits=100, expire_months=24)
    store = GenerationStore(redis)
    fields: dict[str, str | int] = {
        "model": "seedream-4", "kind": "image", "prompt": "p",
        "size": "1024x1024", "count": 1, "seed": 1,
    }  # fmt: skip
    for first in range(0, jobs, MINE):
        account = new_account_id()
        await ledger.open(account, f"{account}@example.com", account)
        for _ in range(min(MINE, jobs - first)):
            await store.submit(
                account, secrets.token_hex(10), price=6, cap=MINE, idempotency="",
                body_hash="", deadline=time.time() + 86400, fields=fields,
            )  # fmt: skip


async def latencies(
    session: aiohttp.ClientSession, url: str, count: int
) -> list[float]:
    """Ask for the first page of generations `count` times, one after another."""
    out = []
    for _ in range(count):
        started = time.perf_counter()
        async with session.get(f"{url}/api/generations") as response:
            await response.read()
            assert response.status == 200
        out.append((time.perf_counter() - started) * 1000)
    return out


def percentiles(samples: list[float]) -> tuple[float, float]:
    """p50 and p99 in milliseconds."""
    cuts = statistics.quantiles(samples, n=100)
    return statistics.median(samples), cuts[98]


async def main(requests: int, block: int, queued: int) -> None:
    with (
        tempfile.TemporaryDirectory() as scratch,
        RedisServer(data_dir=Path(scratch) / "redis") as redis_server,
        MailCatcher() as mail,
    ):
        redis = Redis.from_url(redis_server.url)
        await fill_the_line(redis, queued - MINE)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        app = start(
            ["-m", "service", "serve"],
            studio_environ(redis_server.url, mail, Path(scratch) / "media", port),
            0,
        )
        try:
            await healthy(url)
            waiting, done = await sign_in(url, mail, 0), await sign_in(url, mail, 1)
            for session in (waiting, done):
                for _ in range(MINE):
                    async with session.post(f"{url}/api/generations", json=BODY) as r:
                        assert r.status == 202, await r.text()
            async with done.post(
                f"{url}/api/generations/cancel", json={"status": "all"}
            ) as r:
                assert (await r.json())["canceled"] == MINE
            async with waiting.get(f"{url}/api/generations") as r:
                places = [g["queue_position"] for g in (await r.json())["items"]]
            # the 4 canceled ones left the line: mine are the last four of 10,000
            assert places == list(range(queued, queued - MINE, -1))
            await latencies(waiting, url, block)  # warm both
            await latencies(done, url, block)
            ours: list[float] = []
            base: list[float] = []
            for index in range(requests // block):
                order = [(waiting, ours), (done, base)]
                for session, into in order if index % 2 == 0 else order[::-1]:
                    into += await latencies(session, url, block)
            for session in (waiting, done):
                await session.close()
        finally:
            app.terminate()
            app.wait()
            await redis.aclose()
    ours_p50, ours_p99 = percentiles(ours)
    base_p50, base_p99 = percentiles(base)
    print(
        f"GET /api/generations, {MINE} of mine queued among {queued:,}"
        f" ({len(ours)} requests each side, one at a time)"
    )
    print(f"  {'':34} {'p50 ms':>8} {'p99 ms':>8}")
    print(f"  {'with places (serve)':34} {ours_p50:8.2f} {ours_p99:8.2f}")
    print(f"  {'baseline: same page, none queued':34} {base_p50:8.2f} {base_p99:8.2f}")
    print(f"  ratio p50 {ours_p50 / base_p50:.3f}  p99 {ours_p99 / base_p99:.3f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--block", type=int, default=200)
    parser.add_argument("--queued", type=int, default=QUEUED_IN_ALL)
    options = parser.parse_args()
    sys.exit(uvloop.run(main(options.requests, options.block, options.queued)))
