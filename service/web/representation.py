"""Serve prepared bytes from memory: headers, ETags, gzip and 304s decided once."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass

from aiohttp import hdrs, web

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
    not_modified: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class Representation:
    """A response prepared once, served many times."""

    identity: Variant
    gzipped: Variant | None
    etags: frozenset[str]

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
    etags = frozenset(v.headers[hdrs.ETAG] for v in variants if hdrs.ETAG in v.headers)
    return Representation(identity=variants[0], gzipped=gzipped, etags=etags)


def _matches(if_none_match: str, etags: frozenset[str]) -> bool:
    """Compare If-None-Match weakly, as RFC 9110 §13.1.2 asks."""
    if if_none_match.strip() == "*":
        return True
    for candidate in if_none_match.split(","):
        candidate = candidate.strip()
        if candidate.startswith("W/"):
            candidate = candidate[2:]
        if candidate in etags:
            return True
    return False


def respond(request: web.Request, rep: Representation) -> web.Response:
    """Answer with the representation's best variant, or a 304."""
    headers = request.headers
    variant = rep.identity
    if rep.gzipped is not None and accepts_gzip(headers.get(hdrs.ACCEPT_ENCODING)):
        variant = rep.gzipped
    if (
        rep.etags
        and (inm := headers.get(hdrs.IF_NONE_MATCH))
        and _matches(inm, rep.etags)
    ):
        return web.Response(status=304, headers=variant.not_modified)
    return web.Response(body=variant.body, headers=variant.headers)
