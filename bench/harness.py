"""What both benchmarks share: pinned servers, wrk slices, paired ratios.

Servers run on CPU 0 and wrk on CPU 1. Each slice records wall-clock requests
per second and requests per CPU-second of the server process (from /proc). The
load alternates between the two sides of a comparison, swapping who goes first,
and medians of the per-pair ratios are reported.
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
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.store.embedded import free_port

HERE = Path(__file__).resolve().parent
SECRET = "bench-secret-key-0123456789abcdef-0123456789"
TICKS = os.sysconf("SC_CLK_TCK")


def pinned(cpu: int, command: list[str]) -> list[str]:
    """Pin a command to one CPU when taskset is there (taskset execs in place)."""
    return ["taskset", "-c", str(cpu), *command] if shutil.which("taskset") else command


@dataclass(frozen=True)
class Server:
    port: int
    pid: int

    def cpu_seconds(self) -> float:
        """Return user + system CPU time the server has used so far."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS


@contextmanager
def server(
    which: str,
    redis_url: str,
    loop: str = "uvloop",
    variables: Mapping[str, str] | None = None,
) -> Iterator[Server]:
    """Start a server on CPU 0 and yield it once it answers.

    `serve` is the shipped command itself, with its default settings (access log
    on, written to /dev/null here); the other names are bench/servers.py's
    baselines and variants.
    """
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_")}
    environ |= {"STUDIO_REDIS_URL": redis_url, "STUDIO_SECRET_KEY": SECRET}
    environ |= dict(variables or {})
    if which == "serve":
        environ |= {"STUDIO_PORT": str(port), "STUDIO_HOST": "127.0.0.1"}
        command = [sys.executable, "-m", "service", "serve"]
    else:
        command = [sys.executable, str(HERE / "servers.py"), which, "--port", str(port)]
        command += ["--loop", loop]
    process = subprocess.Popen(
        pinned(0, command), env=environ, cwd=HERE.parent, stdout=subprocess.DEVNULL
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError(f"{which} did not start") from None
                time.sleep(0.1)
        yield Server(port, process.pid)
    finally:
        process.terminate()
        process.wait(timeout=10)


@dataclass(frozen=True)
class Slice:
    rps: float
    per_cpu_second: float


def load(
    target: Server, path: str, accept: str | None, args: argparse.Namespace
) -> Slice:
    """Run wrk on CPU 1 against one server; measure wall and CPU throughput."""
    command = ["wrk", "-t1", f"-c{args.connections}", f"-d{args.seconds}s"]
    if accept:
        command += ["-H", f"Accept: {accept}"]
    command.append(f"http://127.0.0.1:{target.port}{path}")
    before = target.cpu_seconds()
    run = subprocess.run(pinned(1, command), capture_output=True, text=True, check=True)
    used = target.cpu_seconds() - before
    if "Socket errors" in run.stdout or ("Non-2xx" in run.stdout and not args.non_2xx):
        raise RuntimeError(f"wrk saw errors:\n{run.stdout}")
    total = re.search(r"(\d+) requests in", run.stdout)
    rps = re.search(r"Requests/sec:\s+([\d.]+)", run.stdout)
    if not (total and rps):
        raise RuntimeError(run.stdout)
    return Slice(float(rps.group(1)), int(total.group(1)) / max(used, 1 / TICKS))


Target = tuple[Server, str, str | None]


def compare(ours: Target, base: Target, args: argparse.Namespace) -> dict[str, float]:
    """Alternate the load between two targets; return medians of rps and ratios."""
    for target in (ours, base):
        load(*target, argparse.Namespace(**{**vars(args), "seconds": 1}))  # warm-up
    slices: dict[str, list[Slice]] = {"ours": [], "base": []}
    for index in range(args.pairs):
        order = [("ours", ours), ("base", base)]
        for name, target in order if index % 2 == 0 else order[::-1]:
            slices[name].append(load(*target, args))
    pairs = list(zip(slices["ours"], slices["base"], strict=True))
    return {
        "ours_rps": statistics.median(s.rps for s in slices["ours"]),
        "base_rps": statistics.median(s.rps for s in slices["base"]),
        "wall": statistics.median(o.rps / b.rps for o, b in pairs),
        "cpu": statistics.median(o.per_cpu_second / b.per_cpu_second for o, b in pairs),
    }


def arguments(description: str | None, **counts: int) -> argparse.Namespace:
    """Parse the options every benchmark takes, and its own counts (name=default)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pairs", type=int, default=9)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--connections", type=int, default=32)
    for name, default in counts.items():
        parser.add_argument(f"--{name}", type=int, default=default)
    args = parser.parse_args()
    args.non_2xx = False
    if not shutil.which("wrk"):
        sys.exit("wrk is needed: apt-get install wrk")
    return args


def medians(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Return each figure's median over several rows (of fresh processes each)."""
    return {name: statistics.median(row[name] for row in rows) for name in rows[0]}


def report(title: str, rows: Mapping[str, Mapping[str, float]]) -> None:
    """Print one line per comparison with its ratios."""
    print(title)
    for name, row in rows.items():
        print(
            f"{name:22} ours {row['ours_rps']:7.0f} req/s  baseline"
            f" {row['base_rps']:7.0f} req/s  ratio wall {row['wall']:.3f}"
            f"  cpu {row['cpu']:.3f}"
        )
