"""Fixed ports for servers that also bind port + 10000 (Redis Cluster, SeaweedFS).

Such a server cannot take a port from the kernel (port 0): its twin must be free
too. Both are chosen below the kernel's ephemeral range, where no outgoing
connection and no `free_port()` lands, and each xdist worker picks from a slice
of its own, so parallel workers never race for the same port.
"""

from __future__ import annotations

import os
import random
import socket
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


def worker_ports() -> range:
    """The ports this xdist worker (or a plain run) may pick; twins sit above."""
    below = min(_ephemeral_start(), 65536) - TWIN
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    size = (below - LOWEST) // workers
    start = LOWEST + index * size
    return range(start, start + size)


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
