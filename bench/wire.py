"""CPU a Redis round trip costs the limiter: its own wire against redis-py's client.

Starts a Redis-compatible server of its own and, in one process pinned to one
core, sends the same command (`PING`, then the limiter's script run of one
decision) one at a time through each client, then prints the CPU each round
trip took and the ratio against redis-py's client as the limiter built it
before it had a wire of its own (a blocking pool, cancel-safe connections, a
1 s socket timeout). Then a store's script run as the money paths run it
(`run_script`: loaded again after a `SCRIPT FLUSH`, the client's socket
timeout and retries) against the same script registered with redis-py.

Then the same script run by 50 callers at once, as a busy `serve`'s requests
make them: through `call`, which writes the first at once and the other 49 at
the end of the turn in one write; through `send`, one write each (what the
wire did before it gathered a turn's commands); and through redis-py's client.
Run: `.venv/bin/python bench/wire.py [--rounds 20000]`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

from service.limits.limiter import GCRA_BATCH_SCRIPT, Limiter
from service.store.connect import connect
from service.store.embedded import RedisServer
from service.store.wire import run_script, wire_of

# Callers at once in the second part: the bench's 50 signed-in clients.
CROWD = 50
Call = Callable[[], Awaitable[Any]]


async def _cpu_per_call(call: Callable[[], Awaitable[Any]], rounds: int) -> float:
    """Return µs of this process's CPU per awaited call, after a warm-up."""
    for _ in range(rounds // 20):
        await call()
    started = time.process_time()
    for _ in range(rounds):
        await call()
    return (time.process_time() - started) / rounds * 1e6


async def _main(url: str, rounds: int) -> None:
    # The limiter's own two clients: redis-py's pool as it builds it, and its wire.
    limiter = Limiter.from_url(url)
    pooled, wire = limiter.redis, limiter.wire
    assert wire is not None
    sha = await pooled.script_load(GCRA_BATCH_SCRIPT)
    # One decision of one policy, as the limiter's batch sends it (1 call, 0 reads).
    script = ("EVALSHA", sha, 1, "bench:wire:{ip4:10.0.0.1}:p", "", 1, 0, 1, 9, 1, 1)
    # A store's script as the money paths run it: EVALSHA, loaded again after
    # a SCRIPT FLUSH, within the client's socket timeout, retried as it retries.
    store = connect(url, cluster=False, socket_timeout=1, connect_timeout=1)
    stored = store.register_script("return 1")
    store_wire = wire_of(store)
    keys = ["bench:wire:k"]
    rows: list[tuple[str, Call, Call]] = [
        ("PING", lambda: wire.call("PING"), lambda: pooled.ping()),
        (
            "the limiter's script run (one decision)",
            lambda: wire.call(*script),
            lambda: pooled.execute_command(*script),  # type: ignore[no-untyped-call]
        ),
        (
            "a store's script run (run_script)",
            lambda: run_script(store_wire, stored, keys, []),
            lambda: stored(keys=keys, args=[]),
        ),
    ]
    print(f"one command at a time, {rounds} rounds; µs of CPU a round trip")
    for label, by_wire, by_redis_py in rows:
        ours = await _cpu_per_call(by_wire, rounds)
        theirs = await _cpu_per_call(by_redis_py, rounds)
        print(
            f"{label:42} wire {ours:6.1f}  redis-py {theirs:6.1f}  "
            f"ratio {theirs / ours:5.2f}x"
        )

    async def gathered() -> Any:
        return await asyncio.gather(*(wire.call(*script) for _ in range(CROWD)))

    async def each_written() -> Any:
        sent = [wire.send(*script) for _ in range(CROWD)]
        return await asyncio.gather(*(f for f in sent if f is not None))

    async def by_pool() -> Any:
        calls = (pooled.execute_command(*script) for _ in range(CROWD))  # type: ignore[no-untyped-call]
        return await asyncio.gather(*calls)

    crowds = max(rounds // CROWD, 20)
    turn = await _cpu_per_call(gathered, crowds) / CROWD
    each = await _cpu_per_call(each_written, crowds) / CROWD
    pool = await _cpu_per_call(by_pool, crowds) / CROWD
    print(f"\n{CROWD} callers at once, {crowds} rounds; µs of CPU a script run")
    print(
        f"{'wire, a turn in one write (call)':42} {turn:6.1f}\n"
        f"{'wire, one write each (send)':42} {each:6.1f}  ratio {each / turn:5.2f}x\n"
        f"{'redis-py':42} {pool:6.1f}  ratio {pool / turn:5.2f}x"
    )
    await limiter.aclose()
    await store.aclose()


def main() -> None:
    """Parse arguments, start Redis, run the rounds on one core."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=20_000)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    with (
        RedisServer() as server,
        asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner,
    ):
        runner.run(_main(server.url, args.rounds))


if __name__ == "__main__":
    main()
