"""Slow or oddly framed clients cost the server a bounded time, then their socket."""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
import time
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web, web_response

from service.api import payloads
from service.auth.sessions import COOKIE
from service.store.embedded import MailCatcher, RedisServer
from service.studio import endpoints
from service.web.hardening import (
    HEADER_SECONDS,
    SERVER_NAME,
    handler_options,
    hide_server_version,
    raise_open_files_limit,
)

from .conftest import TEST_SECRET, Client, latest_code
from .processes import running

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = pytest.mark.timing

Exchange = tuple[asyncio.StreamReader, asyncio.StreamWriter]
Opener = Callable[[str, int], Awaitable[Exchange]]


@pytest.fixture
async def connect() -> AsyncIterator[Opener]:
    """Open raw connections that are closed after the test, whatever it asserted."""
    writers: list[asyncio.StreamWriter] = []

    async def opener(host: str, port: int) -> Exchange:
        reader, writer = await asyncio.open_connection(host, port)
        writers.append(writer)
        return reader, writer

    yield opener
    for writer in writers:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


def _address(client: Client) -> tuple[str, int]:
    server = client.server
    assert server.port is not None
    return server.host, server.port


async def _response(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    """Read one response: status, headers (lower-cased names) and body."""
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 15)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name:
            headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return status, headers, body


async def _closed_within(reader: asyncio.StreamReader, seconds: float) -> bool:
    """Tell whether the server closes the connection within `seconds`."""
    try:
        return await asyncio.wait_for(reader.read(65536), seconds) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


async def _sign_in(client: Client, mail_server: MailCatcher) -> str:
    email = f"person-{uuid.uuid4().hex[:10]}@example.com"
    assert (await client.post("/api/auth/code", json={"email": email})).status == 200
    code = latest_code(mail_server, email)
    verify = await client.post("/api/auth/verify", json={"email": email, "code": code})
    assert verify.status == 200
    return verify.cookies[COOKIE].value


async def test_a_json_body_trickling_past_its_deadline_gets_408_and_is_cut_off(
    client: Client, connect: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """408 REQUEST_TIMEOUT at the deadline, then the connection closes at once."""
    monkeypatch.setattr(payloads, "JSON_READ_SECONDS", 0.5)
    reader, writer = await connect(*_address(client))
    writer.write(
        b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b'Content-Length: 60\r\n\r\n{"email": '
    )
    started = time.monotonic()
    status, headers, body = await _response(reader)
    waited = time.monotonic() - started
    assert status == 408
    assert json.loads(body) == {"error": "REQUEST_TIMEOUT"}
    assert headers["connection"] == "close"
    assert headers["x-content-type-options"] == "nosniff"
    assert 0.4 < waited < 3
    writer.write(b'"still trickling')  # no lingering read keeps it open
    assert await _closed_within(reader, 1.0)


async def test_a_json_body_that_arrives_in_pieces_within_the_deadline_is_read(
    client: Client, connect: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deadline is for the whole body, not for each piece; keep-alive stays."""
    monkeypatch.setattr(payloads, "JSON_READ_SECONDS", 3.0)
    body = json.dumps({"email": f"slow-{uuid.uuid4().hex[:8]}@example.com"}).encode()
    reader, writer = await connect(*_address(client))
    writer.write(
        b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(body)
    )
    for start in range(0, len(body), 12):
        writer.write(body[start : start + 12])
        await asyncio.sleep(0.05)
    status, headers, answer = await _response(reader)
    assert status == 200, answer
    assert "connection" not in headers
    assert not await _closed_within(reader, 0.3)


async def test_an_upload_trickling_past_its_deadline_gets_408_and_is_cut_off(
    client: Client,
    connect: Opener,
    mail_server: MailCatcher,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The upload's deadline (120 s in production) ends a slow multipart body too."""
    token = await _sign_in(client, mail_server)
    monkeypatch.setattr(endpoints, "UPLOAD_READ_SECONDS", 0.5)
    reader, writer = await connect(*_address(client))
    writer.write(
        b"POST /api/uploads HTTP/1.1\r\nHost: t\r\n"
        b"Content-Type: multipart/form-data; boundary=b0undary\r\n"
        b"Cookie: " + f"{COOKIE}={token}".encode() + b"\r\n"
        b"Content-Length: 5000\r\n\r\n--b0undary\r\n"
        b'Content-Disposition: form-data; name="file"; filename="a.png"\r\n\r\n\x89PNG'
    )
    status, headers, body = await _response(reader)
    assert status == 408
    assert json.loads(body) == {"error": "REQUEST_TIMEOUT"}
    assert headers["connection"] == "close"
    assert await _closed_within(reader, 1.0)


async def test_http_1_0_with_transfer_encoding_is_refused_on_api_and_closed(
    client: Client, connect: Opener
) -> None:
    """RFC 9112 §6.1: its framing cannot be trusted; 400, and no keep-alive."""
    reader, writer = await connect(*_address(client))
    writer.write(
        b"POST /api/auth/code HTTP/1.0\r\nHost: t\r\nConnection: keep-alive\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"2\r\n{}\r\n0\r\n\r\n"
        b"GET /api/models HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"
    )
    status, headers, body = await _response(reader)
    assert status == 400
    assert json.loads(body) == {"error": "BAD_REQUEST"}
    assert headers.get("connection", "close") == "close"
    assert await _closed_within(reader, 1.0)


async def test_http_1_1_chunked_bodies_are_still_read(
    client: Client, connect: Opener
) -> None:
    """Only the ambiguous HTTP/1.0 framing is refused."""
    body = json.dumps({"email": f"chunk-{uuid.uuid4().hex[:8]}@example.com"}).encode()
    reader, writer = await connect(*_address(client))
    writer.write(
        b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    status, _, answer = await _response(reader)
    assert status == 200, answer


@contextlib.asynccontextmanager
async def _runner(**overrides: float) -> AsyncIterator[int]:
    """Serve a one-route app with the production handler options on a free port."""

    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hello")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app, **{**handler_options(), **overrides})
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


async def test_headers_trickling_past_the_header_deadline_are_cut_off(
    connect: Opener,
) -> None:
    """aiohttp's keep-alive timer is the header deadline; trickling cannot reset it."""
    assert handler_options()["keepalive_timeout"] == HEADER_SECONDS == 10
    async with _runner(keepalive_timeout=0.5) as port:
        reader, writer = await connect("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n")
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 3:
            with contextlib.suppress(ConnectionError):
                writer.write(b"X-Slow: 1\r\n")
            closed = await _closed_within(reader, 0.1)
        assert closed
        assert time.monotonic() - started < 1.5
        reader, writer = await connect("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        status, _, body = await _response(reader)
        assert (status, body) == (200, b"hello")


async def test_server_names_the_service_and_no_versions(
    client: Client, connect: Opener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Documents, /api answers and aiohttp's own 400s all say the same `Server`."""
    default = getattr(web_response, "SERVER_SOFTWARE")  # noqa: B009
    monkeypatch.setattr(web_response, "SERVER_SOFTWARE", default)
    hide_server_version()
    for path in ("/en", "/robots.txt", "/api/models", "/nowhere", "/api/nowhere"):
        response = await client.get(path)
        assert response.headers["Server"] == SERVER_NAME, path
    reader, writer = await connect(*_address(client))
    writer.write(b"GET /x HTTP/1.1 junk\r\n\r\n")
    status, headers, _ = await _response(reader)
    assert (status, headers["server"]) == (400, SERVER_NAME)


def _soft_open_files(pid: int) -> int | None:
    """Read a process's soft open-files limit from /proc (Linux), else None."""
    limits = Path(f"/proc/{pid}/limits")
    if not limits.exists():
        return None
    for line in limits.read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return None


def _healthz_seconds(base: str) -> float:
    started = time.monotonic()
    with urllib.request.urlopen(f"{base}/healthz", timeout=5) as response:
        assert response.status == 200
        assert response.headers["Server"] == SERVER_NAME
    return time.monotonic() - started


async def _watch(
    port: int, send: bytes, then: Callable[[asyncio.StreamWriter], Awaitable[None]]
) -> float:
    """Connect, send, run `then`; return the seconds until the server hung up."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    started = time.monotonic()
    writer.write(send)
    trickle = asyncio.ensure_future(then(writer))
    try:
        with contextlib.suppress(ConnectionError):
            while await reader.read(65536):
                pass
    finally:
        trickle.cancel()
        writer.close()
    return time.monotonic() - started


async def _nothing(writer: asyncio.StreamWriter) -> None:
    await asyncio.sleep(3600)


async def _byte_a_second(writer: asyncio.StreamWriter) -> None:
    while True:
        await asyncio.sleep(1)
        writer.write(b" ")


async def test_serve_sheds_a_thousand_half_open_connections_and_a_trickled_body(
    redis_server: RedisServer,
) -> None:
    """Against `serve` itself: /healthz stays quick; all are closed within deadline."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2500:
        pytest.skip(f"the hard open-files limit ({hard}) is below 2500")
    # serve starts with the usual soft limit of 1024 and must lift it itself.
    resource.setrlimit(resource.RLIMIT_NOFILE, (1024, hard))
    variables = {"STUDIO_REDIS_URL": redis_server.url, "STUDIO_SECRET_KEY": TEST_SECRET}
    try:
        with running("serve", variables) as (base, process):
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
            assert raise_open_files_limit() > 2500
            assert (_soft_open_files(process.pid) or 2501) > 2500
            port = int(base.rsplit(":", 1)[1])
            loop = asyncio.get_running_loop()
            body = _watch(
                port,
                b"POST /api/auth/code HTTP/1.1\r\nHost: t\r\n"
                b"Content-Type: application/json\r\nContent-Length: 900\r\n\r\n{",
                _byte_a_second,
            )
            watchers = [asyncio.ensure_future(body)]
            for _ in range(10):
                watchers += [
                    asyncio.ensure_future(
                        _watch(port, b"GET /healthz HTTP/1.1\r\nHost: ", _nothing)
                    )
                    for _ in range(100)
                ]
                await asyncio.sleep(0.05)
            await asyncio.sleep(1)
            latencies = [
                await loop.run_in_executor(None, _healthz_seconds, base)
                for _ in range(5)
            ]
            assert max(latencies) < 1.0, latencies
            lasted = await asyncio.wait_for(asyncio.gather(*watchers), 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert min(lasted[1:]) > HEADER_SECONDS - 1
    assert max(lasted[1:]) < HEADER_SECONDS + 3
    assert payloads.JSON_READ_SECONDS - 1 < lasted[0] < payloads.JSON_READ_SECONDS + 3
