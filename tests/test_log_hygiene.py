"""Whatever a client sends, the log keeps none of its secrets and grows a line."""

from __future__ import annotations

import logging
import socket
import sys
import time

from service.store.embedded import RedisServer
from service.web.hardening import BadRequestFilter

from .conftest import TEST_SECRET
from .processes import Output, output_of, running

TOKEN = "Zk3p9QvX7bL2mN8rT4wY6uA1sD5fG0hJ3kL9zXcV0bN"
CODE = "48151623"
EMAIL = "leak.canary@example.org"
SECRETS = (TOKEN, CODE, EMAIL)
COOKIE = f"studio_session={TOKEN}"
BODY = f'{{"email":"{EMAIL}","code":"{CODE}"}}'
MALFORMED = {
    "a bad request line": (
        f"POST /api/auth/verify?{EMAIL}&{CODE} HTTP/1.1 {TOKEN}\r\nHost: t\r\n\r\n"
    ),
    "a bad header name": (
        f"POST /api/auth/verify HTTP/1.1\r\nHost: t\r\nCookie: {COOKIE}\r\n"
        f"Bad Name {EMAIL}: {CODE}\r\n\r\n"
    ),
    "an oversized header": (
        f"GET /api/me HTTP/1.1\r\nHost: t\r\nCookie: {COOKIE}; e={EMAIL}; c={CODE}; "
        + "p" * 9000
        + "\r\n\r\n"
    ),
    "invalid chunked encoding": (
        f"POST /api/auth/verify HTTP/1.1\r\nHost: t\r\nCookie: {COOKIE}\r\n"
        "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
        f"zz{EMAIL}{CODE}\r\n{BODY}\r\n0\r\n\r\n"
    ),
    "a bad header value": (
        f"GET /api/me HTTP/1.1\r\nHost: t\r\nCookie: {COOKIE}\x01{EMAIL}{CODE}\r\n\r\n"
    ),
}
# The access log's line of a request, and the one short line we allow beside it.
ACCESS_LINE_BYTES = 256
REASON_LINE_BYTES = 120


def _send(port: int, raw: str) -> bytes:
    """Send raw bytes on a fresh connection; return the status line."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(raw.encode("latin-1"))
        return sock.makefile("rb").readline()


def _access_lines(output: Output) -> int:
    return output.text().count('"status":400')


def _wait_for_access_lines(output: Output, count: int) -> None:
    """The access log is written in blocks, about once a second."""
    deadline = time.monotonic() + 5
    while _access_lines(output) < count and time.monotonic() < deadline:
        time.sleep(0.05)


def test_malformed_requests_log_no_secret_and_at_most_one_short_line(
    redis_server: RedisServer,
) -> None:
    """Bad request line, header, size or chunking: a 400, a line, nothing planted."""
    variables = {"STUDIO_REDIS_URL": redis_server.url, "STUDIO_SECRET_KEY": TEST_SECRET}
    with running("serve", variables) as (base, process):
        output = output_of(process)
        port = int(base.rsplit(":", 1)[1])
        output.wait_for('"path":"/healthz"')  # start-up lines and the first block
        for name, raw in MALFORMED.items():
            before = output.text()
            access_before = _access_lines(output)
            status = _send(port, raw)
            assert status.startswith(b"HTTP/1."), name
            assert b" 400 " in status, name
            _wait_for_access_lines(output, access_before + 1)
            time.sleep(0.1)
            added = output.text()[len(before) :]
            assert not [s for s in SECRETS if s in added], (name, added)
            lines = added.splitlines()
            access = [line for line in lines if line.startswith("{")]
            others = [line for line in lines if not line.startswith("{")]
            assert len(access) == 1, (name, added)
            assert len(access[0]) <= ACCESS_LINE_BYTES, (name, access)
            assert len(others) <= 1, (name, added)
            assert all(len(line) <= REASON_LINE_BYTES for line in others), others
            assert "Traceback" not in added, name
            assert process.poll() is None, name
    everything = output.text()
    assert not [s for s in SECRETS if s in everything]


def _record(
    error: BaseException | None, peer: str = "203.0.113.9"
) -> logging.LogRecord:
    exc_info = (type(error), error, None) if error is not None else None
    return logging.LogRecord(
        "aiohttp.server",
        logging.ERROR,
        __file__,
        1,
        "Error handling request from %s",
        (peer,),
        exc_info,
    )


def test_the_filter_keeps_the_peer_and_the_class_and_drops_the_rest() -> None:
    """One INFO line, no traceback, no message of the exception."""
    from aiohttp.http_exceptions import BadStatusLine

    record = _record(BadStatusLine(f"GET /{CODE} {TOKEN}"))
    assert BadRequestFilter().filter(record)
    assert record.getMessage() == "bad request from 203.0.113.9: BadStatusLine"
    assert (record.levelno, record.levelname) == (logging.INFO, "INFO")
    assert record.exc_info is None
    assert logging.Formatter().format(record).count("\n") == 0


def test_a_flood_of_bad_requests_writes_a_few_lines_a_second_and_a_count() -> None:
    """Over the budget, records are dropped and the next line says how many."""
    from aiohttp.http_exceptions import BadHttpMessage

    now = [100.0]
    bad_request = BadRequestFilter(per_second=3, clock=lambda: now[0])
    kept = [bad_request.filter(_record(BadHttpMessage("x"))) for _ in range(10)]
    assert kept == [True] * 3 + [False] * 7
    now[0] += 1
    record = _record(BadHttpMessage("x"))
    assert bad_request.filter(record)
    assert record.getMessage().endswith("BadHttpMessage (7 more since the last line)")


def test_crashes_of_our_own_handlers_keep_their_traceback() -> None:
    """Only parser errors are shortened: a bug still shows where it is."""
    try:
        raise RuntimeError("a bug")
    except RuntimeError:
        record = logging.LogRecord(
            "aiohttp.server",
            logging.ERROR,
            __file__,
            1,
            "Error handling request from %s",
            ("127.0.0.1",),
            sys.exc_info(),
        )
    assert BadRequestFilter().filter(record)
    assert record.exc_info is not None
    assert record.levelno == logging.ERROR
