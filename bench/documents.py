"""GET /en as HTML and as Markdown: our app against a bare aiohttp app, in one run.

Both servers run at once on CPU 0, wrk on CPU 1. The load alternates between them
in short slices (ours, bare, ours, bare, ...); each adjacent pair gives a ratio, and
the median ratio is reported, which cancels the drift of a shared machine.
Usage: python bench/documents.py [--pairs 9] [--seconds 2] [--connections 32]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.embedded import RedisServer, free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
SECRET = "bench-secret-key-0123456789abcdef-0123456789"


def pinned(cpu: int, command: list[str]) -> list[str]:
    """Pin a command to one CPU when taskset is there."""
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


@contextmanager
def server(which: str, redis_url: str, loop: str = "uvloop") -> Iterator[int]:
    """Start bench/servers.py on CPU 0 and yield its port once it answers."""
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_")}
    environ |= {"STUDIO_REDIS_URL": redis_url, "STUDIO_SECRET_KEY": SECRET}
    command = [sys.executable, str(HERE / "servers.py"), which, "--port", str(port)]
    process = subprocess.Popen(pinned(0, [*command, "--loop", loop]), env=environ)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{which} did not start") from None
                time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=10)


def wrk(url: str, seconds: int, connections: int, accept: str | None) -> float:
    """Run wrk on CPU 1 and return requests per second."""
    command = ["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", url]
    if accept:
        command[1:1] = ["-H", f"Accept: {accept}"]
    run = subprocess.run(pinned(1, command), capture_output=True, text=True, check=True)
    if "Non-2xx" in run.stdout or "Socket errors" in run.stdout:
        raise RuntimeError(f"wrk saw errors:\n{run.stdout}")
    match = re.search(r"Requests/sec:\s+([\d.]+)", run.stdout)
    if not match:
        raise RuntimeError(run.stdout)
    return float(match.group(1))


Target = tuple[int, str, str | None]


def compare(ours: Target, base: Target, args: argparse.Namespace) -> tuple[float, ...]:
    """Alternate the load; return (median ours rps, median base rps, median ratio)."""
    urls = [
        (f"http://127.0.0.1:{port}{path}", accept)
        for port, path, accept in (ours, base)
    ]
    for url, accept in urls:
        wrk(url, 1, args.connections, accept)  # warm-up
    ours_rps, base_rps, ratios = [], [], []
    for index in range(args.pairs):
        # Swap who goes first each pair, so neither always follows the other.
        order = urls if index % 2 == 0 else urls[::-1]
        got = {
            url: wrk(url, args.seconds, args.connections, accept)
            for url, accept in order
        }
        ours_rps.append(got[urls[0][0]])
        base_rps.append(got[urls[1][0]])
        ratios.append(ours_rps[-1] / base_rps[-1])
    return (
        statistics.median(ours_rps),
        statistics.median(base_rps),
        statistics.median(ratios),
    )


def main() -> None:
    """Measure, then print one line per comparison with its ratio."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    with RedisServer() as redis, ExitStack() as stack:
        ours = stack.enter_context(server("ours", redis.url))
        bare = stack.enter_context(server("bare", redis.url))
        plain = stack.enter_context(server("ours", redis.url, loop="asyncio"))
        rows = {
            "html": compare((ours, "/en", None), (bare, "/en", None), args),
            "markdown": compare(
                (ours, "/en", "text/markdown"), (bare, "/en.md", None), args
            ),
            "uvloop": compare((ours, "/en", None), (plain, "/en", None), args),
        }
    print(
        f"GET /en, wrk -t1 -c{args.connections}, {args.pairs} alternating pairs"
        f" of {args.seconds:g}s, medians"
    )
    for name, (ours_rps, base_rps, ratio) in rows.items():
        baseline = "asyncio" if name == "uvloop" else "bare"
        print(
            f"{name:9} ours {ours_rps:8.0f} req/s   {baseline} {base_rps:8.0f} req/s"
            f"   ratio {ratio:.3f}"
        )


if __name__ == "__main__":
    main()
