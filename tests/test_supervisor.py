"""`serve --workers N`: one port, many processes, restarted on death, stopped as one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from service import supervisor
from service.settings import ROOT
from service.store.embedded import RedisServer
from service.supervisor import Supervisor

from .conftest import TEST_SECRET
from .ports import free_port, free_ports_in_a_row
from .processes import studio_environ

WORKERS = 3


def _listening(port: int) -> int:
    """Count the listening TCP sockets on a port (one per worker with SO_REUSEPORT)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            count += state == "0A" and int(local.rsplit(":", 1)[1], 16) == port
    return count


def _children(pid: int) -> set[int]:
    return {
        int(child)
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    }


def _wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        time.sleep(0.05)


@contextmanager
def _supervised(
    tmp_path: Path, redis_url: str, **variables: str
) -> Iterator[tuple[int, subprocess.Popen[bytes], Path]]:
    """Start `serve --workers 3`, stdout to a file; yield once all three listen."""
    port = free_port()
    environ = studio_environ(
        STUDIO_PORT=str(port),
        STUDIO_BASE_URL=f"http://127.0.0.1:{port}",
        STUDIO_REDIS_URL=redis_url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        **variables,
    )
    stdout = tmp_path / "stdout"
    command = [sys.executable, "-m", "service", "serve", "--workers", str(WORKERS)]
    with stdout.open("wb") as out, (tmp_path / "stderr").open("wb") as err:
        process = subprocess.Popen(
            command, cwd=ROOT, env=environ, stdout=out, stderr=err
        )
    try:
        _wait_for(lambda: _listening(port) == WORKERS, 30, f"{WORKERS} listeners")
        yield port, process, stdout
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _pids_serving(port: int, stdout: Path, tag: str, count: int = 60) -> set[int]:
    """Send requests, each on a new connection; return the pids that logged them."""
    for number in range(count):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/robots.txt",
            headers={"X-Request-Id": f"{tag}-{number}"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200

    def ours() -> list[int]:
        lines = [json.loads(line) for line in stdout.read_text().splitlines()]
        return [
            line["pid"] for line in lines if line["request_id"].startswith(f"{tag}-")
        ]

    _wait_for(lambda: len(ours()) == count, 5, "every access line flushed")
    return set(ours())


def test_three_workers_share_the_port_and_stop_together_on_sigterm(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """The kernel spreads connections over all three, each with its metrics port;
    SIGTERM ends all, status 0.
    """
    metrics = free_ports_in_a_row(WORKERS)
    variables = {"STUDIO_METRICS_PORT": str(metrics)}
    with _supervised(tmp_path, redis_server.url, **variables) as (
        port,
        process,
        stdout,
    ):
        children = _children(process.pid)
        assert len(children) == WORKERS
        assert _pids_serving(port, stdout, "spread") == children
        # Each worker has its own metrics listener: port, port + 1, port + 2.
        for index in range(WORKERS):
            url = f"http://127.0.0.1:{metrics + index}/metrics"
            with urllib.request.urlopen(url, timeout=5) as response:
                assert response.status == 200
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    for pid in children:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _listening(port) == 0


def test_a_killed_worker_is_replaced_and_its_successor_serves(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """SIGKILL one child: the supervisor starts another, which takes its share."""
    with _supervised(tmp_path, redis_server.url) as (port, process, stdout):
        before = _children(process.pid)
        victim = min(before)
        os.kill(victim, signal.SIGKILL)
        _wait_for(
            lambda: (
                victim not in _children(process.pid)
                and len(_children(process.pid)) == WORKERS
                and _listening(port) == WORKERS
            ),
            30,
            "a successor listening",
        )
        after = _children(process.pid)
        assert len(after - before) == 1
        assert _pids_serving(port, stdout, "after") == after


def test_serve_with_workers_checks_settings_once_and_exits_2(tmp_path: Path) -> None:
    """A bad setting stops the supervisor before any worker starts: one line, 2."""
    result = subprocess.run(
        [sys.executable, "-m", "service", "serve", "--workers", "3"],
        cwd=ROOT,
        env=studio_environ(STUDIO_SECRET_KEY=TEST_SECRET),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "studio: configuration error: STUDIO_REDIS_URL: required by serve"
    ]


def test_a_worker_that_keeps_dying_at_start_gives_up_with_status_1(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash loop (say, the port is taken) ends instead of spinning forever."""
    monkeypatch.setattr(supervisor, "MAX_DELAY", 0.01)
    command = [sys.executable, "-c", "raise SystemExit(1)"]
    started = time.monotonic()
    assert Supervisor(command, 2).run() == 1
    assert time.monotonic() - started < 10


def test_a_worker_with_a_bad_setting_stops_the_others_with_status_2(
    tmp_path: Path,
) -> None:
    """Exit status 2 means configuration: restarting cannot help, so all stop."""
    flag = tmp_path / "first"
    script = (
        "import os, sys, time\n"
        f"try: os.close(os.open({str(flag)!r}, os.O_CREAT | os.O_EXCL))\n"
        "except FileExistsError: time.sleep(60)\n"
        "else: sys.exit(2)\n"
    )
    started = time.monotonic()
    assert Supervisor([sys.executable, "-c", script], 2, grace=5).run() == 2
    assert time.monotonic() - started < 5
