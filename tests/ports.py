"""Ports for the tests' servers, from a slice of their own per xdist worker (and
the CPU priority of their Redis servers, STORE_PRIORITY, at the end).

A port the kernel hands out (bind to port 0, close, start a child on it) can be
handed to another worker's child before ours binds it; the loser then fails to
start, or its readiness check reaches the other worker's server. So every port
here is chosen below the kernel's ephemeral range, where no outgoing connection
and no kernel choice lands, and each xdist worker picks from its own slice.
Servers that also bind port + 10000 (Redis Cluster, SeaweedFS) take twins from
[LOWEST, TWINS_END); single ports come from [TWINS_END, LOWEST + TWIN).
"""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Final

TWIN: Final = 10000
LOWEST: Final = 20000
_EPHEMERAL: Final = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _ephemeral_start() -> int:
    try:
        return int(_EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _slice(lowest: int, end: int) -> range:
    """This xdist worker's share of [lowest, end) (all of it in a plain run)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    size = (end - lowest) // workers
    start = lowest + index * size
    return range(start, start + size)


def _twins_end() -> int:
    return min(_ephemeral_start(), 65536) - TWIN


def worker_ports() -> range:
    """The ports this xdist worker (or a plain run) may pick; twins sit above."""
    return _slice(LOWEST, _twins_end())


def _single_ports() -> Iterator[int]:
    """This worker's single ports in turn from a random start, so none repeats soon."""
    choices = _slice(_twins_end(), LOWEST + TWIN)
    start = random.randrange(len(choices))
    return itertools.cycle([*choices[start:], *choices[:start]])


_SINGLE: Final = _single_ports()


def free_port() -> int:
    """A loopback port free now that no other xdist worker will pick."""
    for port in _SINGLE:
        if bindable(port):
            return port
    raise AssertionError("unreachable: the cycle is endless")


def bindable(port: int) -> bool:
    """Tell whether a loopback port is free now."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def twin_ports(count: int, taken: set[int] | None = None) -> list[int]:
    """Free ports whose +10000 twins are free too, none of them in `taken`."""
    taken = set() if taken is None else taken
    choices = worker_ports()
    chosen: list[int] = []
    while len(chosen) < count:
        port = random.choice(choices)
        if port in taken or port + TWIN in taken:
            continue
        if bindable(port) and bindable(port + TWIN):
            taken.update((port, port + TWIN))
            chosen.append(port)
    return chosen


def free_ports_in_a_row(count: int) -> int:
    """The first of `count` consecutive free ports, none to be handed out again soon."""
    while True:
        first = free_port()
        if all(
            next(_SINGLE) == port and bindable(port)
            for port in range(first + 1, first + count)
        ):
            return first


# The tests' Redis servers run ahead of the rest for the CPU (a nice value;
# ignored without the right to lower it). The suite packs servers, apps,
# workers, browsers and their load onto two cores, and the limiter must decide
# within 100 ms of Redis time (CONTRACT §3) or fail closed with 503: a store
# starved of CPU by that load, as a Redis on its own host never is, made a
# sign-in answer 503 in 2 of 5 soak runs.
STORE_PRIORITY: Final = -10
