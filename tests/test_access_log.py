"""The access log: one JSON line per request, written in blocks, none lost at stop."""

from __future__ import annotations

import asyncio
import calendar
import fcntl
import http.client
import ipaddress
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, make_mocked_request

from service.settings import SettingsError, load_settings
from service.store.embedded import RedisServer
from service.web.access_log import AccessLog

from .conftest import TEST_SECRET
from .ports import free_port
from .processes import studio_environ, wait_until_healthy


@pytest.fixture
def pipe() -> Iterator[tuple[int, int]]:
    """Give a pipe whose read end never blocks."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    yield read, write
    os.close(read)
    os.close(write)


def _drain(fd: int) -> list[dict[str, Any]]:
    data = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    return [json.loads(line) for line in data.decode().splitlines()]


async def _ok(request: web.Request) -> web.Response:
    return web.Response(text="ok")


async def _lines_for(
    log: AccessLog, fd: int, *requests: tuple[str, dict[str, str]]
) -> list[dict[str, Any]]:
    """Serve each request through a real server with the log, flush, read the lines."""
    app = web.Application()
    app.router.add_get("/{tail:.*}", _ok)
    server = TestServer(app)
    await server.start_server(**log.runner_options())
    async with TestClient(server) as client:
        for path, headers in requests:
            response = await client.get(path, headers=headers)
            assert response.status == 200
    log.flush()
    return _drain(fd)


async def test_each_request_is_one_json_line_without_query_or_cookies(
    pipe: tuple[int, int],
) -> None:
    """Path without its query, status, bytes, ms, client, id, pid; no secrets."""
    read, write = pipe
    headers = {"Cookie": "studio_session=s3cr3t-token", "X-Request-Id": "abc-123"}
    (line,) = await _lines_for(
        AccessLog(write), read, ("/square?code=12345678&x=1", headers)
    )
    assert set(line) == {
        "time",
        "method",
        "path",
        "status",
        "bytes",
        "ms",
        "client",
        "request_id",
        "pid",
    }
    assert line["method"] == "GET"
    assert line["path"] == "/square"
    assert line["status"] == 200
    assert line["bytes"] > len("ok")
    assert line["ms"] >= 0
    assert line["client"] == "127.0.0.1"
    assert line["request_id"] == "abc-123"
    assert line["pid"] == os.getpid()
    assert line["time"].endswith("Z")
    stamp = calendar.timegm(time.strptime(line["time"], "%Y-%m-%dT%H:%M:%S.%fZ"))
    assert abs(time.time() - stamp) < 60
    text = json.dumps(line)
    assert "12345678" not in text
    assert "s3cr3t" not in text


async def test_an_absent_or_odd_request_id_is_replaced_by_a_short_unique_one(
    pipe: tuple[int, int],
) -> None:
    """Only a sane X-Request-Id is trusted; anything else gets 12 hex digits."""
    read, write = pipe
    odd = {"X-Request-Id": 'bad"id\\' + "x" * 200}
    lines = await _lines_for(AccessLog(write), read, ("/", {}), ("/", {}), ("/", odd))
    ids = [line["request_id"] for line in lines]
    assert len(set(ids)) == 3
    assert all(len(i) == 12 and int(i, 16) >= 0 for i in ids)


async def test_the_client_is_forwarded_only_by_a_trusted_proxy(
    pipe: tuple[int, int],
) -> None:
    """X-Forwarded-For is walked from the right, as the rate limiter does."""
    read, write = pipe
    forwarded = {"X-Forwarded-For": "198.51.100.1, 203.0.113.9, 127.0.0.2"}
    trusted = AccessLog(write, trusted_proxies=[ipaddress.ip_network("127.0.0.0/8")])
    untrusted = AccessLog(write)
    (relayed,) = await _lines_for(trusted, read, ("/", forwarded))
    (direct,) = await _lines_for(untrusted, read, ("/", forwarded))
    assert relayed["client"] == "203.0.113.9"
    assert direct["client"] == "127.0.0.1"


def _record(log: AccessLog, count: int, path: str = "/p") -> None:
    """Record `count` finished requests, numbered by their X-Request-Id."""
    response = web.Response(text="ok")
    for number in range(count):
        headers = {"X-Request-Id": f"n-{number}"}
        log.record(make_mocked_request("GET", path, headers=headers), response, 0.001)


def _numbers(lines: list[dict[str, Any]]) -> list[int]:
    return [int(line["request_id"].removeprefix("n-")) for line in lines]


async def test_lines_wait_in_memory_until_the_timer(pipe: tuple[int, int]) -> None:
    """No write per request: the lines go out together when the timer fires."""
    read, write = pipe
    log = AccessLog(write, interval=0.2)
    _record(log, 50)
    assert _drain(read) == []
    await asyncio.sleep(0.4)
    assert _numbers(_drain(read)) == list(range(50))


async def test_a_full_buffer_is_written_at_once_in_whole_lines_of_pipe_size(
    pipe: tuple[int, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each write is at most PIPE_BUF and ends a line: workers never interleave."""
    read, write = pipe
    writes: list[bytes] = []
    real_write = os.write

    def recording_write(fd: int, data: bytes) -> int:
        writes.append(bytes(data))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", recording_write)
    log = AccessLog(write, interval=60, flush_lines=100)
    _record(log, 99)
    assert writes == []
    _record(log, 1)
    assert len(writes) > 1
    assert all(len(w) <= select.PIPE_BUF and w.endswith(b"\n") for w in writes)
    assert len(_drain(read)) == 100
    log.close()


def test_a_full_non_blocking_descriptor_keeps_the_rest_for_later(
    pipe: tuple[int, int],
) -> None:
    """A write that would block is not waited for; nothing is lost or reordered."""
    read, write = pipe
    os.set_blocking(write, False)
    capacity = fcntl.fcntl(write, 1032)  # F_GETPIPE_SZ
    log = AccessLog(write, flush_lines=10**9)
    count = 2 * capacity // 256
    _record(log, count, path="/" + "a" * 255)
    log.flush()
    lines = _drain(read)
    assert 0 < len(lines) < count
    for _ in range(count):
        if len(lines) == count:
            break
        log.flush()
        lines += _drain(read)
    assert _numbers(lines) == list(range(count))


def test_the_setting_is_on_by_default_and_takes_on_or_off() -> None:
    """STUDIO_ACCESS_LOG is on/off; anything else is refused naming the variable."""
    assert load_settings({}).access_log
    assert not load_settings({"STUDIO_ACCESS_LOG": "off"}).access_log
    assert load_settings({"STUDIO_ACCESS_LOG": "on"}).access_log
    with pytest.raises(SettingsError, match=r"^STUDIO_ACCESS_LOG: must be on or off$"):
        load_settings({"STUDIO_ACCESS_LOG": "sometimes"})


def _serve(tmp_path: Path, redis_url: str, **variables: str) -> tuple[str, Path]:
    """Start `serve` with stdout to a file, send 300 requests, SIGTERM it."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    environ = studio_environ(
        STUDIO_PORT=str(port),
        STUDIO_BASE_URL=base_url,
        STUDIO_REDIS_URL=redis_url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        **variables,
    )
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "service", "serve"],
            cwd=Path(__file__).resolve().parent.parent,
            env=environ,
            stdout=out,
            stderr=err,
            text=True,
        )
    try:
        wait_until_healthy(base_url, process, timeout=20)
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        for number in range(300):
            connection.request(
                "GET", "/en?token=x", headers={"X-Request-Id": f"t-{number}"}
            )
            response = connection.getresponse()
            response.read()
            assert response.status == 200
        connection.close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0, stderr.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return stdout.read_text(), stderr


def test_serve_writes_every_line_before_it_exits_on_sigterm(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """300 requests then SIGTERM, well within the 1 s timer: 300 lines on stdout."""
    output, _ = _serve(tmp_path, redis_server.url)
    lines = [json.loads(line) for line in output.splitlines()]
    ours = [line for line in lines if line["request_id"].startswith("t-")]
    assert [line["request_id"] for line in ours] == [f"t-{n}" for n in range(300)]
    assert {line["path"] for line in ours} == {"/en"}


def test_serve_with_the_access_log_off_writes_no_line(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    """STUDIO_ACCESS_LOG=off: stdout stays empty, stderr has no access record."""
    output, stderr = _serve(tmp_path, redis_server.url, STUDIO_ACCESS_LOG="off")
    assert output == ""
    assert "/en" not in stderr.read_text()
