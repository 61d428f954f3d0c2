"""A Redis Cluster on loopback for the tests: 3 masters with one replica each.

Made from the same binary as every other test server (find_server_binary),
set up with CLUSTER ADDSLOTSRANGE / SET-CONFIG-EPOCH / MEET / REPLICATE through
redis-py, so it needs no redis-cli. A short node timeout makes a failover take
a few seconds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from redis import Redis
from redis.exceptions import RedisError

from service.store.embedded import find_server_binary

from .ports import STORE_PRIORITY, twin_ports

NODE_TIMEOUT_MS: Final = 1000
SLOTS: Final = 16384


@dataclass
class Node:
    """One cluster server process: its port, data directory and process."""

    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Spawn the server (it reloads nodes.conf from its directory)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        args = [
            find_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.directory),
            "--cluster-enabled", "yes",
            "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--cluster-replica-validity-factor", "0",
            "--save", "",
            "--appendonly", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        self.process = subprocess.Popen(
            args,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        with contextlib.suppress(PermissionError):  # as conftest's STORE_PRIORITY
            os.setpriority(os.PRIO_PROCESS, self.process.pid, STORE_PRIORITY)

    def client(self) -> Redis:
        """A plain client to this node alone."""
        return Redis(port=self.port, socket_timeout=2.0, decode_responses=True)

    def alive(self) -> bool:
        """Tell whether the process runs and answers PING."""
        if self.process is None or self.process.poll() is not None:
            return False
        try:
            with self.client() as client:
                return bool(client.ping())
        except OSError:
            return False
        except RedisError:  # loading, or not yet a cluster
            return False

    def kill(self) -> None:
        """SIGKILL the server: no shutdown, no last replication."""
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def stop(self) -> None:
        """Stop the server with SIGTERM and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@dataclass
class Cluster:
    """Three masters (equal slot ranges) with one replica each, on loopback."""

    root: Path
    masters: int = 3
    nodes: list[Node] = field(default_factory=list)

    @property
    def url(self) -> str:
        """The redis+cluster:// URL naming every node as a seed."""
        seeds = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"redis+cluster://{seeds}"

    def start(self, timeout: float = 30.0) -> None:
        """Spawn 2 × masters servers, assign slots, join them, pair replicas."""
        for port in twin_ports(self.masters * 2):  # the bus port is port + 10000
            self.nodes.append(Node(port, self.root / str(port)))
        for node in self.nodes:
            node.start()
        deadline = time.monotonic() + timeout
        _until(lambda: all(node.alive() for node in self.nodes), deadline)
        primaries, replicas = self.nodes[: self.masters], self.nodes[self.masters :]
        for index, node in enumerate(primaries):
            low = index * SLOTS // self.masters
            high = (index + 1) * SLOTS // self.masters - 1
            with node.client() as client:
                client.execute_command("CLUSTER ADDSLOTSRANGE", low, high)
                client.execute_command("CLUSTER SET-CONFIG-EPOCH", index + 1)
        with self.nodes[0].client() as first:
            for node in self.nodes[1:]:
                first.execute_command("CLUSTER MEET", "127.0.0.1", node.port)
        _until(lambda: self._all_know(len(self.nodes)), deadline)
        for primary, replica in zip(primaries, replicas, strict=True):
            with primary.client() as client:
                node_id = client.execute_command("CLUSTER MYID")
            with replica.client() as client:
                client.execute_command("CLUSTER REPLICATE", node_id)
        _until(self.healthy, deadline)

    def _all_know(self, count: int) -> bool:
        for node in self.nodes:
            with node.client() as client:
                info = client.execute_command("CLUSTER INFO")
            if int(info["cluster_known_nodes"]) != count:
                return False
        return True

    def healthy(self) -> bool:
        """Every live node says ok and every live replica's link to its master is up."""
        for node in self.nodes:
            if not node.alive():
                continue
            with node.client() as client:
                if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                    return False
                replication = client.info("replication")
            if replication["role"] == "slave" and (
                replication.get("master_link_status") != "up"
            ):
                return False
        return True

    def primary_of(self, key: str) -> Node:
        """The node that serves a key's slot now, as a live node sees it."""
        with self.nodes_alive()[0].client() as client:
            slot = int(client.execute_command("CLUSTER KEYSLOT", key))
            nodes = client.execute_command("CLUSTER NODES")
        for address, node in nodes.items():
            if "master" not in node["flags"] or "fail" in node["flags"]:
                continue
            for low, *high in node["slots"]:
                if int(low) <= slot <= int(high[0] if high else low):
                    port = int(address.rpartition(":")[2].partition("@")[0])
                    return next(n for n in self.nodes if n.port == port)
        raise LookupError(key)

    def nodes_alive(self) -> list[Node]:
        """The nodes whose process runs."""
        return [node for node in self.nodes if node.alive()]

    def fail_over(self, key: str, timeout: float = 20.0) -> tuple[Node, Node]:
        """SIGKILL the master of a key; wait until its replica serves the slot."""
        dead = self.primary_of(key)
        dead.kill()
        deadline = time.monotonic() + timeout
        _until(lambda: self._served_by_other(key, dead), deadline)
        return dead, self.primary_of(key)

    def _served_by_other(self, key: str, dead: Node) -> bool:
        try:
            return self.primary_of(key) is not dead and self._ok_everywhere()
        except (RedisError, OSError, LookupError):  # nodes vote, slots move
            return False

    def _ok_everywhere(self) -> bool:
        for node in self.nodes_alive():
            with node.client() as client:
                if client.execute_command("CLUSTER INFO")["cluster_state"] != "ok":
                    return False
        return True

    def rejoin(self, node: Node, timeout: float = 20.0) -> None:
        """Restart a killed node; it comes back as a replica of its successor."""
        node.start()
        deadline = time.monotonic() + timeout
        _until(lambda: node.alive() and self.healthy(), deadline)

    def flush(self, timeout: float = 30.0) -> None:
        """Empty every master once every replica follows, and wait for them to copy it.

        A test that asks for a replica's acknowledgement (WAIT) must not start
        while one is still resyncing, e.g. after the failover test healed it.
        """
        _until(self.healthy, time.monotonic() + timeout)
        for node in self.nodes_alive():
            with node.client() as client:
                replication = client.info("replication")
                if replication["role"] != "master":
                    continue
                client.flushall()
                followers = int(replication.get("connected_slaves", 0))
                if (
                    followers
                    and client.execute_command("WAIT", followers, 10_000) < followers
                ):
                    raise TimeoutError(
                        f"a replica of {node.port} did not copy the flush"
                    )

    def stop(self) -> None:
        """Stop every server."""
        for node in self.nodes:
            node.stop()


def _until(condition: Callable[[], bool], deadline: float) -> None:
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the cluster did not get there in time")
        time.sleep(0.05)
