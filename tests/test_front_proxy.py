"""deploy/nginx.conf in front of a real `serve`: slow clients wait at the proxy only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from service.store.embedded import RedisServer
from service.web.hardening import raise_open_files_limit

from .conftest import TEST_SECRET
from .nginx import NGINX, nginx_in_front
from .ports import free_port
from .processes import Output, output_of, running

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = [
    pytest.mark.skipif(
        NGINX is None, reason="nginx is not installed (apt-get install nginx)"
    ),
    pytest.mark.timing,
]
# deploy/nginx.conf's timeouts; the proxy must have cut a stalled client by then.
HEADER_TIMEOUT = 10.0
BODY_TIMEOUT = 10.0
SLOW_CONNECTIONS = 1000
# Loopback addresses the slow clients come from, as many different machines would.
SOURCES = [f"127.0.0.{n}" for n in range(2, 12)]


@dataclass(frozen=True)
class Stack:
    """The proxy's port, the app's output, and the proxy's own log."""

    port: int
    app: Output
    proxy_log: Path


@pytest.fixture(scope="module")
def stack(redis_server: RedisServer) -> Iterator[Stack]:
    """Start `serve` trusting the proxy, then nginx with deploy/nginx.conf before it."""
    assert NGINX is not None
    soft = raise_open_files_limit()
    if soft < 2 * SLOW_CONNECTIONS + 500:
        pytest.skip(f"the open-files limit ({soft}) is too low for this test")
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_TRUSTED_PROXIES": "127.0.0.1/32",
    }
    with (
        running("serve", variables) as (base, process),
        nginx_in_front(base.removeprefix("http://")) as proxy,
    ):
        yield Stack(port=proxy.port, app=output_of(process), proxy_log=proxy.log)


async def _hold(port: int, source: str, send: bytes, drip: bytes = b"") -> float:
    """Connect from `source`, send, drip a byte a second; return seconds until cut."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source, 0)
    )
    started = time.monotonic()
    writer.write(send)

    async def dripping() -> None:
        while drip:
            await asyncio.sleep(1)
            writer.write(drip)

    dripper = asyncio.ensure_future(dripping())
    try:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
    finally:
        dripper.cancel()
        writer.close()
    return time.monotonic() - started


def _healthz(port: int) -> tuple[float, str]:
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as r:
        assert r.status == 200
        server = r.headers["Server"]
    return time.monotonic() - started, server


async def test_a_thousand_slow_clients_leave_healthz_quick_and_are_cut_off(
    stack: Stack,
) -> None:
    """Half-sent headers and a stalled body are cut by the proxy; the app sees none."""
    loop = asyncio.get_running_loop()
    slow: list[asyncio.Future[float]] = []
    for number in range(SLOW_CONNECTIONS):
        source = SOURCES[number % len(SOURCES)]
        partial = b"GET /healthz HTTP/1.1\r\nHost: t\r\n" if number % 2 else b"GET /hea"
        slow.append(asyncio.ensure_future(_hold(stack.port, source, partial)))
        if number % 100 == 99:
            await asyncio.sleep(0.05)
    stalled = asyncio.ensure_future(
        _hold(
            stack.port,
            SOURCES[0],
            b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\n"
            b'Content-Type: application/json\r\nContent-Length: 40\r\n\r\n{"em',
        )
    )
    dripping = asyncio.ensure_future(
        _hold(
            stack.port,
            SOURCES[1],
            b"POST /api/auth/verify HTTP/1.1\r\nHost: t\r\n"
            b"Content-Type: application/json\r\nContent-Length: 400\r\n\r\n{",
            drip=b" ",
        )
    )
    await asyncio.sleep(1)
    probes = [await loop.run_in_executor(None, _healthz, stack.port) for _ in range(20)]
    assert max(seconds for seconds, _ in probes) < 0.5, stack.proxy_log.read_text()
    assert {server for _, server in probes} == {"nginx"}  # no version
    assert not any(future.done() for future in slow), "cut before the timeout"
    lasted = await asyncio.wait_for(asyncio.gather(*slow, stalled), 20)
    assert max(lasted) < HEADER_TIMEOUT + 3, max(lasted)
    assert min(lasted[:-1]) > HEADER_TIMEOUT - 1, min(lasted)
    assert BODY_TIMEOUT - 1 < lasted[-1] < BODY_TIMEOUT + 3, lasted[-1]
    # A body still dripping is held by the proxy alone: the app never saw it.
    assert not dripping.done()
    dripping.cancel()
    await asyncio.sleep(1.2)  # the app writes its access log about once a second
    app_log = stack.app.text()
    assert '"path":"/api/auth/code"' not in app_log
    assert '"path":"/api/auth/verify"' not in app_log


async def _exchange(
    port: int, data: bytes, source: str = "127.0.0.1", close_wait: float = 0.0
) -> tuple[bytes, bool]:
    """Send a request; return the whole response and whether the proxy then hung up.

    With `close_wait` 0 the connection is not watched (False).
    """
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", port, local_addr=(source, 0)
    )
    try:
        writer.write(data)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        length = next(
            (
                int(line.split(b":", 1)[1])
                for line in head.split(b"\r\n")
                if line.lower().startswith(b"content-length:")
            ),
            0,
        )
        answer = head + await reader.readexactly(length)
        closed = False
        if close_wait:
            try:
                closed = await asyncio.wait_for(reader.read(65536), close_wait) == b""
            except ConnectionError:
                closed = True
            except TimeoutError:
                closed = False
        return answer, closed
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def test_http_1_0_with_transfer_encoding_is_refused_and_closed(
    stack: Stack,
) -> None:
    """nginx refuses the ambiguous framing before the app could read it."""
    answer, closed = await _exchange(
        stack.port,
        b"POST /api/auth/code HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n",
        close_wait=1.0,
    )
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert closed, "the connection was kept open"


async def test_bodies_over_our_limits_get_our_json_413(stack: Stack) -> None:
    """16 KiB for JSON, 10 MiB plus framing for uploads: refused at the proxy."""
    over_json, _ = await _exchange(
        stack.port,
        b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        b"Content-Type: application/json\r\nContent-Length: 16385\r\n\r\n",
    )
    assert over_json.startswith(b"HTTP/1.1 413 ")
    assert over_json.endswith(b'{"error":"PAYLOAD_TOO_LARGE"}')
    over_upload, _ = await _exchange(
        stack.port,
        b"POST /api/uploads HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: %d\r\n\r\n" % (10 * 1024 * 1024 + 64 * 1024 + 1),
    )
    assert over_upload.startswith(b"HTTP/1.1 413 ")
    assert over_upload.endswith(b'{"error":"TOO_LARGE"}')
    within, _ = await _exchange(
        stack.port,
        b"POST /api/uploads HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        b"Content-Type: multipart/form-data; boundary=b\r\n"
        b"Content-Length: 20\r\n\r\n--b--\r\n" + b" " * 13,
    )
    assert within.startswith(b"HTTP/1.1 401 ")  # the app's answer: no session


async def test_the_app_sees_the_client_address_and_not_a_forged_one(
    stack: Stack,
) -> None:
    """X-Forwarded-For is replaced by the peer's address, which the app trusts."""
    before = len(stack.app.text())
    answer, _ = await _exchange(
        stack.port,
        b"GET /api/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
        b"X-Forwarded-For: 198.51.100.7\r\n\r\n",
        source="127.0.0.9",
    )
    assert answer.startswith(b"HTTP/1.1 200 ")
    deadline = time.monotonic() + 5
    lines: list[dict[str, object]] = []
    while not lines and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        lines = [
            json.loads(line)
            for line in stack.app.text()[before:].splitlines()
            if '"path":"/api/models"' in line
        ]
    assert [line["client"] for line in lines] == ["127.0.0.9"]


async def test_what_nginx_refuses_itself_is_json_with_the_exact_status(
    stack: Stack,
) -> None:
    """A request nginx cannot parse, an 8 KiB request line, 8 KiB of one header,
    a bad chunk of a body: JSON like the app's errors, not nginx's HTML pages."""
    cases = [
        (b"GET /x HTTP/1.1 junk\r\n\r\n", 400, "BAD_REQUEST"),
        (b"GET /api/x HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n", 400, "BAD_REQUEST"),
        (
            b"GET /api/" + b"a" * 9000 + b" HTTP/1.1\r\nHost: t\r\n\r\n",
            414,
            "REQUEST_URI_TOO_LONG",
        ),
        (
            b"GET /en HTTP/1.1\r\nHost: t\r\nCookie: " + b"a" * 9000 + b"\r\n\r\n",
            400,  # as the app answers a Cookie over 4 KB (CONTRACT §3)
            "BAD_REQUEST",
        ),
        (
            b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\nContent-Type: "
            b"application/json\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            400,
            "BAD_REQUEST",
        ),
    ]
    for request, status, code in cases:
        answer, _ = await _exchange(stack.port, request)
        head, _, body = answer.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").lower().split("\r\n")
        assert lines[0].startswith(f"http/1.1 {status}"), (request[:40], lines[0])
        assert "content-type: application/json" in lines
        assert json.loads(body) == {"error": code}


async def test_api_requests_while_the_app_is_down_get_a_json_503() -> None:
    """Restarting or gone: 503 UNAVAILABLE with Retry-After, as the app answers
    when its store is away, not nginx's 502 page."""
    with nginx_in_front(f"127.0.0.1:{free_port()}") as proxy:  # nothing listens
        for request in (
            b"GET /api/square HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
            b"POST /api/uploads HTTP/1.1\r\nHost: t\r\nConnection: close\r\n"
            b"Content-Length: 2\r\n\r\nab",
            b"GET /api/events HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        ):
            answer, _ = await _exchange(proxy.port, request)
            assert answer.startswith(b"HTTP/1.1 503 "), answer[:60]
            assert b"\r\nRetry-After: 5\r\n" in answer
            assert answer.endswith(b'\r\n\r\n{"error":"UNAVAILABLE"}')
