"""Serve prepared bytes from memory: headers, ETags, gzip and 304s decided once."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from http import HTTPStatus

from aiohttp import hdrs, web, web_response
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import HttpVersion11
from aiohttp.http_writer import StreamWriter, _serialize_headers as serialize_headers
from multidict import CIMultiDict, CIMultiDictProxy

from .headers import SecurityHeaders
from .negotiation import accepts_gzip

# Below this size gzip saves less than its own framing and CPU cost.
_GZIP_MIN_BYTES = 512
# A 304 repeats the 200's headers (RFC 9110 §15.4.5) but not what describes the body.
_BODY_HEADERS = frozenset(
    {hdrs.CONTENT_TYPE, hdrs.CONTENT_ENCODING, "x-markdown-tokens"}
)


@dataclass(frozen=True, slots=True)
class Variant:
    """One content coding of a representation: its bytes and exact headers."""

    body: bytes
    headers: Mapping[str, str]
    not_modified: Mapping[str, str] = field(default_factory=dict)
    status: int = 200
    # The serialized head and the Date and Server lines it was built with.
    _head: list[tuple[bytes, bytes]] = field(
        default_factory=lambda: [(b"", b"")], compare=False, repr=False
    )

    @property
    def etag(self) -> str | None:
        """Return this variant's own entity tag, if it has one."""
        return self.headers.get(hdrs.ETAG)

    def head(self) -> bytes:
        """Return the status line and headers, serialized once a second.

        The same bytes aiohttp writes for this body on a kept-alive HTTP/1.1 GET:
        our headers in order, then Content-Length, Date and Server, as its
        Response._start and _prepare_headers add them.
        """
        tail = _date_and_server()
        cached = self._head[0]
        if cached[0] is tail:  # the same second, the same Server
            return cached[1]
        lines = [f"{name}: {value}" for name, value in self.headers.items()]
        lines.append(f"Content-Length: {len(self.body)}")
        if any("\r" in line or "\n" in line for line in lines):
            raise ValueError("a prepared header holds a line break")
        status = f"HTTP/1.1 {self.status} {HTTPStatus(self.status).phrase}"
        data = ("\r\n".join([status, *lines]) + "\r\n").encode() + tail
        self._head[0] = (tail, data)
        return data


def _server() -> str:
    """What aiohttp puts in `Server` now (hardening.py renames it at start-up)."""
    return str(vars(web_response)["SERVER_SOFTWARE"])


def _direct_writer(
    response: web.Response, request: web.BaseRequest
) -> StreamWriter | None:
    """The writer to hand a head to directly on the common path: a kept-alive
    HTTP/1.1 request, no response-prepare signals, nothing to compress, chunk
    or set as a cookie. None where aiohttp's own path must run."""
    writer = request._payload_writer
    if (
        not isinstance(request, web.Request)
        or request.version != HttpVersion11
        or not request.keep_alive
        or response._keep_alive is not None
        or response._cookies
        or response._compression
        or response._chunked
        or not isinstance(writer, StreamWriter)
        or writer._on_headers_sent is not None
    ):
        return None
    for app in request.match_info.apps:  # a loop, not any(): no generator a request
        if app.on_response_prepare:
            return None
    return writer


# Date and Server, the last two lines of every head: (date, server, the lines).
_TAIL: list[tuple[str, str, bytes]] = [("", "", b"")]


def _date_and_server() -> bytes:
    """Return the head's Date and Server lines and its end, built once a second
    (and again if the Server name changed: hardening.py renames it)."""
    date, server = rfc822_formatted_time(), _server()
    cached = _TAIL[0]
    if cached[0] == date and cached[1] == server:
        return cached[2]
    tail = f"Date: {date}\r\nServer: {server}\r\n\r\n".encode()
    _TAIL[0] = (date, server, tail)
    return tail


def _hand_head(
    response: web.Response,
    request: web.BaseRequest,
    writer: StreamWriter,
    head: bytes,
    length: int | None,
) -> StreamWriter:
    """Give the writer a serialized head, as aiohttp's `_start` leaves it; the
    body follows on write_eof."""
    response._req = request
    response._payload_writer = writer
    response._keep_alive = True
    writer.length = length
    writer._headers_buf = head
    writer._headers_written = False
    return writer


class PreparedResponse(web.Response):
    """Send a variant with a head serialized once a second, not per request.

    aiohttp builds, checks and serializes every response's headers for each
    request; a prepared variant's never change but for Date. On the
    common path (a kept-alive HTTP/1.1 GET, no response-prepare signals) the
    writer gets the cached head; anything else takes aiohttp's own path.
    tests/test_representation.py holds the two paths to the same bytes.
    """

    __slots__ = ("_variant",)

    def __init__(self, variant: Variant) -> None:
        super().__init__(
            status=variant.status, body=variant.body, headers=variant.headers
        )
        self._variant = variant

    async def _start(self, request: web.BaseRequest) -> AbstractStreamWriter:
        writer = _direct_writer(self, request)
        if writer is None or request.method != hdrs.METH_GET:
            return await super()._start(request)
        head = self._variant.head()
        return _hand_head(self, request, writer, head, len(self._variant.body))


class DirectResponse(web.Response):
    """A response whose head is serialized in one step on the common path.

    aiohttp's own path runs three coroutines and a dozen checks to add
    Content-Length, Date and Server and serialize the head: `GET /api/square`
    took 64.2 µs of `serve`'s CPU a request through it and 60.6 this way. On
    the common path (a kept-alive HTTP/1.1 request with a body, no
    response-prepare signals) this writes the same lines in the same order:
    the answer's own headers serialized as aiohttp does, then Content-Length,
    and Date and Server built once a second (5.7 -> 4.4 µs a `_start`, timed
    in `serve`). Anything else takes aiohttp's own path.
    tests/test_representation.py holds the two paths to the same bytes.
    """

    __slots__ = ()

    async def _start(self, request: web.BaseRequest) -> AbstractStreamWriter:
        writer = _direct_writer(self, request)
        body = self._body
        headers = self._headers
        if (
            writer is None
            or request.method == hdrs.METH_HEAD
            or self._must_be_empty_body
            or not isinstance(body, bytes)
            or not body
            or hdrs.CONTENT_TYPE not in headers
            or hdrs.CONTENT_LENGTH in headers
            or hdrs.DATE in headers
            or hdrs.SERVER in headers
        ):
            return await super()._start(request)
        # aiohttp's Response._start, then StreamResponse._prepare_headers, add
        # Content-Length, Date and Server after the others: the same lines here,
        # the last two built once a second, none added to the headers.
        length = len(body)
        head = b"".join(
            (
                serialize_headers(f"HTTP/1.1 {self._status} {self._reason}", headers)[
                    :-2
                ],
                b"Content-Length: %d\r\n" % length,
                _date_and_server(),
            )
        )
        return _hand_head(self, request, writer, head, length)


def json_head(cache_control: str) -> CIMultiDictProxy[str]:
    """Build a JSON answer's own headers once: a Response copies them, which
    costs less than building them from a dict and a content type each time."""
    return CIMultiDictProxy(
        CIMultiDict(
            {hdrs.CACHE_CONTROL: cache_control, hdrs.CONTENT_TYPE: "application/json"}
        )
    )


@dataclass(frozen=True, slots=True)
class Representation:
    """A response prepared once, served many times."""

    identity: Variant
    gzipped: Variant | None

    @property
    def body(self) -> bytes:
        """Return the uncompressed bytes."""
        return self.identity.body

    @property
    def headers(self) -> Mapping[str, str]:
        """Return the headers of the uncompressed variant."""
        return self.identity.headers


def _variant(body: bytes, headers: dict[str, str]) -> Variant:
    kept = {k: v for k, v in headers.items() if k not in _BODY_HEADERS}
    return Variant(body=body, headers=headers, not_modified=kept)


def prepare(
    body: bytes,
    content_type: str,
    headers: Mapping[str, str] | None = None,
    *,
    security: SecurityHeaders,
    tag: str = "r",
    etag: bool = True,
    compress: bool = True,
) -> Representation:
    """Build a representation once: ETag from its bytes, gzip twin if worth it."""
    base = {
        hdrs.CONTENT_TYPE: content_type,
        **(headers or {}),
        **security.for_type(content_type),
    }
    compressible = compress and len(body) >= _GZIP_MIN_BYTES
    if compressible:
        vary = base.get(hdrs.VARY)
        base[hdrs.VARY] = f"{vary}, Accept-Encoding" if vary else "Accept-Encoding"
    digest = hashlib.sha256(body).hexdigest()[:20]
    if etag:
        base[hdrs.ETAG] = f'"{tag}-{digest}"'
    gzipped = None
    if compressible:
        zipped = {**base, hdrs.CONTENT_ENCODING: "gzip"}
        if etag:
            zipped[hdrs.ETAG] = f'"{tag}-{digest}-gz"'
        gzipped = _variant(gzip.compress(body, compresslevel=9, mtime=0), zipped)
    variants = [v for v in (_variant(body, base), gzipped) if v is not None]
    return Representation(identity=variants[0], gzipped=gzipped)


def _matches(if_none_match: str, etag: str) -> bool:
    """Compare If-None-Match weakly, as RFC 9110 §13.1.2 asks."""
    if if_none_match.strip() == "*":
        return True
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate == etag:
            return True
    return False


def respond(request: web.Request, rep: Representation) -> web.Response:
    """Answer with the representation's best variant, or a 304."""
    headers = request.headers
    variant = rep.identity
    if rep.gzipped is not None and accepts_gzip(headers.get(hdrs.ACCEPT_ENCODING)):
        variant = rep.gzipped
    # Only the selected variant's tag matches (RFC 9110 §13.1.2): a cache that
    # holds the gzip twin must not be told its copy suits a client without gzip.
    if (
        (etag := variant.etag) is not None
        and (inm := headers.get(hdrs.IF_NONE_MATCH))
        and _matches(inm, etag)
    ):
        return web.Response(status=304, headers=variant.not_modified)
    return PreparedResponse(variant)
