"""One JSON line per request, kept in memory and written in blocks, not per request.

aiohttp's default access logger formats a record and hands it to `logging` for
every request: a lock, a formatter and a write system call each time. This one
keeps a tuple of the request's facts and formats them all at once, in one tight
loop, when it writes: once a second, when `FLUSH_LINES` are waiting, and when
the server stops. A busy process makes a few writes a second however many
requests it serves, and a request pays a couple of microseconds.

Each line names the time, method, path (never the query: queries may carry
secrets), status, bytes, milliseconds, the client as the rate limiter sees it,
a request id (the client's `X-Request-Id` when it is sane, else a random one)
and the process id, which tells the processes of `serve --workers N` apart.
Cookies, bodies and every other header are never read.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import select
import time
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii
from typing import Any, ClassVar, Final, cast

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from ..limits.client_ip import IPNetwork, forwarded_client, parse_ip

_LOGGER: Final = logging.getLogger(__name__)

# Write when this many requests are waiting, without waiting for the timer.
FLUSH_LINES: Final = 256
# Beyond this much unwritten (the descriptor refuses more), new requests are
# counted, not kept: the log must never eat the process's memory.
MAX_PENDING_BYTES: Final = 4 * 1024 * 1024
# Writes of at most PIPE_BUF bytes to a pipe are atomic: the processes of
# `serve --workers N` share one stdout, and their lines must not interleave.
CHUNK_BYTES: Final = select.PIPE_BUF
# A path longer than this is cut, so that any line, escaped, fits in one chunk.
MAX_PATH_CHARS: Final = 256
_SANE_REQUEST_ID: Final = re.compile(r"[A-Za-z0-9._:=+/@-]{1,128}")
_MAX_DIRECT_PEERS: Final = 4096
_MAX_MIDDLES: Final = 4096

# time, method, raw path, status, bytes, seconds, client, X-Request-Id or None
Row = tuple[float, str, str, int, int, float, str, str | None]


class AccessLog:
    """Collect the requests of one process and write their lines out in blocks."""

    def __init__(
        self,
        fd: int = 1,
        *,
        trusted_proxies: Sequence[IPNetwork] = (),
        interval: float = 1.0,
        flush_lines: int = FLUSH_LINES,
    ) -> None:
        self._fd = fd
        self._trusted = tuple(trusted_proxies)
        self._interval = interval
        self._flush_lines = flush_lines
        self._rows: list[Row] = []
        # What a non-blocking descriptor refused last time, to go out first.
        self._unwritten = b""
        self._timer: asyncio.TimerHandle | None = None
        self._closed = False
        self._dropped = 0
        self._failed = False
        # Clients that are not our proxies, by their socket address text.
        self._direct: dict[str, str] = {}
        self._pid = os.getpid()
        # Request ids need to be unique, not secret: 12 hex digits, a random
        # prefix drawn when the process starts and a counter.
        self._id_prefix = f"{random.getrandbits(16):04x}"
        self._sequence = 0
        self._middles: dict[tuple[str, str, int], str] = {}
        self._second = -1
        self._stamp = ""

    def logger_class(self) -> type[AbstractAccessLogger]:
        """Return the class aiohttp instantiates per connection, bound to this log."""
        return type("BoundJsonAccessLogger", (JsonAccessLogger,), {"sink": self})

    def runner_options(self) -> dict[str, Any]:
        """Return the run_app / AppRunner arguments that log through this."""
        return {
            "access_log_class": self.logger_class(),
            "access_log": logging.getLogger("aiohttp.access"),
        }

    def record(
        self, request: BaseRequest, response: StreamResponse, seconds: float
    ) -> None:
        """Keep the facts of one finished request; format them later, in bulk."""
        if len(self._unwritten) > MAX_PENDING_BYTES:
            self._dropped += 1
            return
        self._rows.append(
            (
                time.time(),
                request.method,
                request.raw_path,
                response.status,
                response.body_length,
                seconds,
                self.client(request),
                request.headers.get("X-Request-Id"),
            )
        )
        if self._closed or len(self._rows) >= self._flush_lines:
            self.flush()
        elif self._timer is None:
            self._schedule()

    def client(self, request: BaseRequest) -> str:
        """Name the client as the limiter does: X-Forwarded-For only via our proxies."""
        remote = request.remote or ""
        if (known := self._direct.get(remote)) is not None:
            return known
        peer = parse_ip(remote)
        if peer is not None and any(peer in net for net in self._trusted):
            # It reads nothing but the headers, which every BaseRequest has.
            relayed = cast(web.Request, request)
            return str(forwarded_client(relayed, peer, self._trusted))
        if len(self._direct) >= _MAX_DIRECT_PEERS:
            self._direct.clear()
        name = self._direct[remote] = "unknown" if peer is None else str(peer)
        return name

    def _schedule(self) -> None:
        """Flush in `interval` seconds, or now when no event loop runs."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
        else:
            self._timer = loop.call_later(self._interval, self.flush)

    def _lines(self) -> str:
        """Format every waiting request as one line of JSON."""
        pid = self._pid
        lines = []
        middles = self._middles
        for now, method, raw_path, status, length, seconds, client, given in self._rows:
            whole = int(now)
            if whole != self._second:
                self._second = whole
                self._stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
            millis = int((now - whole) * 1000)
            # Method, path and status repeat: each combination is escaped once.
            if (middle := middles.get((method, raw_path, status))) is None:
                middle = self._middle(method, raw_path, status)
            if given is not None and _SANE_REQUEST_ID.fullmatch(given):
                request_id = given
            else:
                self._sequence += 1
                request_id = f"{self._id_prefix}{self._sequence:08x}"
            lines.append(
                f'{{"time":"{self._stamp}.{millis:03d}Z",{middle}"bytes":{length},'
                f'"ms":{seconds * 1000:.2f},"client":"{client}",'
                f'"request_id":"{request_id}","pid":{pid}}}\n'
            )
        self._rows.clear()
        if self._dropped:
            lines.append(f'{{"dropped":{self._dropped},"pid":{pid}}}\n')
            self._dropped = 0
        return "".join(lines)

    def _middle(self, method: str, raw_path: str, status: int) -> str:
        """Escape a method, path and status as the middle of a line, and keep it."""
        if len(self._middles) >= _MAX_MIDDLES:
            self._middles.clear()
        path = raw_path.partition("?")[0][:MAX_PATH_CHARS]
        middle = self._middles[(method, raw_path, status)] = (
            f'"method":{encode_basestring_ascii(method)},'
            f'"path":{encode_basestring_ascii(path)},"status":{status},'
        )
        return middle

    def flush(self) -> None:
        """Write every waiting line, in chunks that end at a line's end."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._rows and not self._dropped and not self._unwritten:
            return
        block = self._unwritten + self._lines().encode("ascii", "replace")
        written = self._write(block)
        self._unwritten = block[written:]
        if self._unwritten and not self._closed:
            # A non-blocking descriptor is full: try again later, never wait.
            self._schedule_retry()

    def _schedule_retry(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._timer = loop.call_later(self._interval, self.flush)

    def _write(self, block: bytes) -> int:
        """Write the block; return how much went out (all, unless it would block)."""
        start = 0
        while start < len(block):
            end = len(block)
            if end - start > CHUNK_BYTES:
                end = block.rfind(b"\n", start, start + CHUNK_BYTES) + 1 or (
                    start + CHUNK_BYTES
                )
            try:
                start += os.write(self._fd, block[start:end])
            except BlockingIOError:
                return start
            except OSError as err:
                if not self._failed:
                    self._failed = True
                    _LOGGER.warning("access log: cannot write: %s", err)
                return len(block)
        return start

    def close(self) -> None:
        """Write what is left; a request recorded later is written at once."""
        self._closed = True
        self.flush()


class JsonAccessLogger(AbstractAccessLogger):
    """aiohttp's access-logger interface, handing every request to the shared log."""

    __slots__ = ()
    sink: ClassVar[AccessLog]

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        """Record the request; a failure here must never fail the response."""
        try:
            self.sink.record(request, response, time)
        except Exception:
            _LOGGER.exception("access log: cannot record a request")
