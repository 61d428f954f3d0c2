"""What the HTTP server itself needs so that hostile or slow clients cost little.

aiohttp's defaults suit a server behind a proxy that absorbs slow clients. When
clients reach the process directly, a connection that never finishes its
headers is held for `keepalive_timeout` (75 s under `run_app`), the process
runs out of file descriptors long before it runs out of anything else, a
malformed request is logged at ERROR with its raw bytes (cookies, e-mail
addresses and codes included) and answered with text quoting them back, and
`Server` names the Python and aiohttp versions. `serve` and `dev` call the
functions here once, at start-up.

Header deadline: aiohttp 3.14 has no separate timeout for reading a request's
headers. Its keep-alive timer is armed when a connection is accepted and re-armed
after each answer, and it closes a connection that is still waiting for a whole
request when it fires, partial headers included, however slowly they trickle.
So `keepalive_timeout` is the header deadline too; bodies get theirs where they
are read (`service/api/payloads.py`, uploads), and the front proxy
(`deploy/nginx.conf`) bounds both before anything reaches us.
"""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import time
import warnings
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web, web_response
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.multipart import BadContentDispositionHeader, BadContentDispositionParam
from aiohttp.web_protocol import RequestHandler

from .error_codes import error_code

# An idle connection, or one still sending its request line and headers, is
# closed after this long. The front proxy keeps its upstream connections idle
# for less (nginx.conf: keepalive_timeout 5s), so it never reuses one we close.
HEADER_SECONDS: Final = 10.0
# After an answer sent before the whole body was read (413, 401, 408...), the
# rest of the body is read and dropped for at most this long, so that the
# client sees the answer rather than a reset; then the connection is closed.
LINGER_SECONDS: Final = 5.0
# Request line and each header line: aiohttp's own limits, stated here.
MAX_LINE_BYTES: Final = 8190
MAX_FIELD_BYTES: Final = 8190
# Browsers send about twenty headers; proxies add a few.
MAX_HEADERS: Final = 64
# Pending connections the kernel may queue for us (capped by net.core.somaxconn).
LISTEN_BACKLOG: Final = 1024
# What `Server` says on every answer: no product versions to look up.
SERVER_NAME: Final = "liuguang-studio"
# Linux refuses a soft limit above fs.nr_open (1048576 by default).
_MAX_OPEN_FILES: Final = 1 << 20

_OWN_ERROR_HEADERS: Final = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}
_JSON_ERRORS: Final = "_answers_in_json"
_SERVER_LOGGER: Final = "aiohttp.server"
# How aiohttp's RequestHandler.handle_error starts its log record.
_BAD_REQUEST_MESSAGE: Final = "Error handling request"
_LOGGER: Final = logging.getLogger(__name__)
# What aiohttp warns about a malformed Content-Disposition, quoting the header.
BAD_DISPOSITION: Final = (BadContentDispositionHeader, BadContentDispositionParam)
# What reading a form a client got wrong raises (multipart or urlencoded): no
# boundary, a part without a name or with a bad header, bytes not in its
# charset, a charset no codec has, a malformed Content-Disposition (warned).
MALFORMED_FORM: Final = (
    ValueError,
    LookupError,
    AssertionError,
    RuntimeError,
    HttpProcessingError,
    *BAD_DISPOSITION,
)


def handler_options() -> dict[str, Any]:
    """Return the keyword arguments for `web.run_app` and `web.AppRunner`."""
    return {
        "keepalive_timeout": HEADER_SECONDS,
        "lingering_time": LINGER_SECONDS,
        "max_line_size": MAX_LINE_BYTES,
        "max_field_size": MAX_FIELD_BYTES,
        "max_headers": MAX_HEADERS,
    }


def raise_open_files_limit() -> int:
    """Lift the soft RLIMIT_NOFILE to the hard limit; return the soft limit now.

    Each connection holds a descriptor; at the usual soft limit of 1024 a
    thousand idle connections make `accept` fail for everyone else.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _MAX_OPEN_FILES if hard == resource.RLIM_INFINITY else hard
    wanted = min(wanted, _MAX_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
        except (ValueError, OSError) as err:
            _LOGGER.warning("cannot raise the open files limit: %s", err)
        else:
            soft = wanted
    return soft


def hide_server_version() -> None:
    """Make `Server` name the service, not the Python and aiohttp versions.

    aiohttp fills `Server` from `web_response.SERVER_SOFTWARE` when a response
    has none, for every answer including its own 400s to malformed requests,
    so replacing that one default covers all of them at no cost per request.
    """
    setattr(web_response, "SERVER_SOFTWARE", SERVER_NAME)  # noqa: B010


def answer_own_errors_in_json() -> None:
    """Make the answers aiohttp gives by itself `{"error": CODE}`, as every other.

    aiohttp answers a request it cannot parse (a bad request line, header or
    chunk size, a line over the limit) with text that quotes the request's own
    bytes back, and a crash outside the /api boundary with text or HTML. Its
    `handle_error` still runs (it logs through the filter below, and refuses
    when an answer was already sent); only the answer it returns is replaced.
    The connection is closed after it, as aiohttp does.
    """
    handle_error = RequestHandler.handle_error
    if getattr(handle_error, _JSON_ERRORS, False):
        return

    def json_handle_error(
        self: RequestHandler,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        handle_error(self, request, status, exc, message)
        # The code the /api boundary gives the same status (400, 500).
        code = error_code(status)
        response = web.Response(
            status=status,
            body=json.dumps({"error": code}).encode(),
            content_type="application/json",
            headers=_OWN_ERROR_HEADERS,
        )
        response.force_close()
        return response

    setattr(json_handle_error, _JSON_ERRORS, True)
    setattr(RequestHandler, "handle_error", json_handle_error)  # noqa: B010


def close_after_response(request: web.BaseRequest) -> None:
    """Close the connection once the answer is out, dropping any unread body.

    For a client that sends its body too slowly, or frames it ambiguously:
    waiting for the rest of it, even for the lingering time, is what it wants.
    """
    protocol = request.protocol
    # No public knob skips the lingering read for one response; a connection
    # about to close needs none. Left alone if a future aiohttp renames it.
    with contextlib.suppress(AttributeError):
        protocol._lingering_time = 0.0
    protocol.close()


class BadRequestFilter(logging.Filter):
    """Turn aiohttp's report of a malformed request into one short line.

    aiohttp logs every request it cannot parse at ERROR with a traceback whose
    message quotes the raw bytes: cookies, e-mail addresses and codes end up in
    the log, and each 33-byte request writes about 700 bytes. This keeps only
    the peer and the exception's class, at INFO, at most `per_second` lines a
    second; the rest are counted and the count is told on the next line.
    Crashes of our own handlers keep their tracebacks.
    """

    def __init__(
        self, per_second: int = 10, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self._per_second = per_second
        self._clock = clock
        self._second = -1
        self._logged = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        """Rewrite a bad-request record in place, drop it over budget, else pass."""
        if not (
            isinstance(record.msg, str) and record.msg.startswith(_BAD_REQUEST_MESSAGE)
        ):
            return True
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and not isinstance(error, HttpProcessingError):
            return True  # a crash of a handler: its traceback is ours to read
        second = int(self._clock())
        if second != self._second:
            self._second, self._logged = second, 0
        if self._logged >= self._per_second:
            self._dropped += 1
            return False
        self._logged += 1
        args = record.args if isinstance(record.args, tuple) else ()
        peer = str(args[0])[:64] if args else "unknown"
        kind = type(error).__name__ if error is not None else "unknown"
        record.msg, record.args = "bad request from %s: %s", (peer, kind)
        if self._dropped:
            record.msg += " (%d more since the last line)"
            record.args += (self._dropped,)
            self._dropped = 0
        record.exc_info = record.exc_text = record.stack_info = None
        if record.levelno > logging.INFO:
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def setup_log_hygiene() -> None:
    """Install the bad-request filter on aiohttp's server logger (once).

    And raise aiohttp's warnings about a client's Content-Disposition (as the
    tests do), so that its reader answers 400 instead of the log quoting it.
    """
    logger = logging.getLogger(_SERVER_LOGGER)
    if not any(isinstance(f, BadRequestFilter) for f in logger.filters):
        logger.addFilter(BadRequestFilter())
    for category in BAD_DISPOSITION:
        warnings.filterwarnings("error", category=category)
