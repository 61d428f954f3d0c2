"""GET /api/square three ways, in one run, against their baselines.

1. ours, every request allowed (one EVALSHA each), against the same handler
   limited by the `limits` library's async Redis moving window (hit, then window
   stats for the headers, as Flask-Limiter and slowapi do). Target: >= 3.5x
   (issue 29; it was 1.5x). Beside it, the ceiling any limiter on aiohttp
   has: the bare handler below (no limiter, no /api layers, the page from a
   constant) against the same `limits` peer.
2. ours with a single client flooding far past its limit (every answer a 429,
   denials remembered in process) against a bare aiohttp handler returning the
   square's first page from a constant. Target: >= 0.8x. Also against a bare
   handler returning our very 429 from constants, which isolates our machinery
   from what aiohttp itself spends on a 429.

The first comparison runs on `--starts` fresh pairs of processes (default 3)
and prints each and their median: two starts of the very same `serve` differ
by up to a tenth in CPU a request on this VM, more than most changes move it,
so one start is one draw from that spread.

Usage: python bench/square.py [--pairs 9] [--seconds 2] [--connections 32]
                              [--starts 3]
"""

from __future__ import annotations

import asyncio
from contextlib import ExitStack

from harness import Server, arguments, compare, medians, report, server
from redis.asyncio import Redis

from service.square.feed import SquareStore, Work
from service.store.embedded import RedisServer

OPEN = {
    "STUDIO_LIMITS_GALLERY_QUOTA": "1000000000",
    "STUDIO_LIMITS_GALLERY_BURST": "100000000",
}
FLOOD = {
    "STUDIO_LIMITS_GALLERY_QUOTA": "2",
    "STUDIO_LIMITS_GALLERY_WINDOW": "3600",
    "STUDIO_LIMITS_GALLERY_BURST": "1",
}


async def publish(url: str, count: int = 20) -> None:
    """Fill the square with works so a page has something to show."""
    client = Redis.from_url(url)
    store = SquareStore(client)
    for index in range(count):
        work = Work(
            id=f"bench{index}",
            kind="image",
            model="seedream-4",
            prompt=f"a lighthouse at dusk, study {index}",
            media_url=f"/media/bench{index}.png",
            thumb_url=f"/media/bench{index}.webp",
            width=1024,
            height=1024,
            content_type="image/png",
            published_at="2026-11-23T10:00:00Z",
        )
        await store.publish(work, owner="bench")
    await client.aclose()


def main() -> None:
    """Measure and print the ratios."""
    args = arguments(__doc__, starts=3)
    path = "/api/square"
    with RedisServer() as redis, ExitStack() as stack:
        asyncio.run(publish(redis.url))

        def started(scope: ExitStack) -> tuple[Server, Server]:
            """Start ours and the `limits` peer, afresh."""
            return (
                scope.enter_context(server("serve", redis.url, variables=OPEN)),
                scope.enter_context(server("limits", redis.url, variables=OPEN)),
            )

        starts = []
        for _ in range(args.starts - 1):
            with ExitStack() as scope:
                ours, limits = started(scope)
                starts.append(compare((ours, path, None), (limits, path, None), args))
        ours, limits = started(stack)  # the last pair: the rows below use it too
        starts.append(compare((ours, path, None), (limits, path, None), args))
        rows = {"ours vs limits": medians(starts)}
        rows |= {
            f"  start {n} of {args.starts}": row for n, row in enumerate(starts, 1)
        }
        # Flooding servers keep their buckets in another database: the same
        # client address under a far smaller policy must not touch OPEN's buckets.
        flood_url = redis.url.rsplit("/", 1)[0] + "/1"
        flood = stack.enter_context(server("serve", flood_url, variables=FLOOD))
        bare = stack.enter_context(server("square-bare", redis.url, variables=OPEN))
        bare_429 = stack.enter_context(
            server("square-bare-429", flood_url, variables=FLOOD)
        )
        # what no limiter on aiohttp can pass: aiohttp answering a constant
        rows["bare vs limits"] = compare((bare, path, None), (limits, path, None), args)
        # a `top` page reads a ranking snapshot: it should cost what `new` costs
        rows["top vs new (ours)"] = compare(
            (ours, path + "?sort=top", None), (ours, path, None), args
        )
        args.non_2xx = True  # the flooding client is answered 429 on purpose
        rows["flood 429 vs bare"] = compare(
            (flood, path, None), (bare, path, None), args
        )
        rows["flood 429 vs bare 429"] = compare(
            (flood, path, None), (bare_429, path, None), args
        )
    report(
        f"GET /api/square; wrk -t1 -c{args.connections}; {args.pairs} alternating"
        f" pairs of {args.seconds}s; medians; cpu = requests per server CPU-second",
        rows,
    )


if __name__ == "__main__":
    main()
