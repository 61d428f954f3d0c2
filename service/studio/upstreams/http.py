"""HTTP plumbing every vendor protocol shares, so each adapter only maps its API.

One `UpstreamHttp` per configured upstream: one aiohttp session (a connection
limit, timeouts, a resolver that refuses private addresses other than the
upstream's own host), the key kept out of logs, reprs and error messages, and
the common fault mapping: a transport error, a timeout, 408, 409, 429 and 5xx
are transient (retried by the worker, honouring Retry-After); any other answer
outside 2xx is a refusal; a 2xx that cannot be read fails without a retry.

API (for the protocol adapters):
    http = UpstreamHttp(base_url, api_key, scheme="Bearer", timeout=120.0)
    answer = await http.call("POST", "/v1/images/generations", json={...})
    answer.status, answer.headers, answer.body; answer.json() -> Any (or raises)
    raise http_fault(answer)     # the common mapping of a non-2xx answer
    data = await fetch_result(http, url, kind="image")   # see fetch.py
    await http.aclose()
`within` overrides the upstream's timeout (seconds) for one call (a long poll).
`call` raises UpstreamError itself for transport errors, timeouts, redirects
and bodies over `limit`; it never raises for a status: the adapter looks at
`answer.status` first (its own refusals, e.g. content policy) and then raises
`http_fault(answer)` for the rest.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import email.utils
import ipaddress
import json as jsonlib
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from multidict import CIMultiDictProxy

from .base import UpstreamError

FAILED: Final = "UPSTREAM_FAILED"
# A JSON answer larger than this is not an answer (4 base64 images fit well).
JSON_LIMIT: Final = 128 * 1024 * 1024
# Connections one worker process keeps open to one upstream.
CONNECTIONS: Final = 32
# The longest Retry-After honoured: past it the job's deadline decides anyway.
MAX_RETRY_AFTER: Final = 600.0
TRANSIENT_STATUSES: Final = frozenset({408, 409, 429})
_CHUNK: Final = 64 * 1024

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class Secret:
    """A credential that shows itself only when asked (never in a repr or a log)."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """Return the value, for the one header that carries it."""
        return self._value

    def __bool__(self) -> bool:
        return bool(self._value)

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__


def failed(
    *, transient: bool = False, retry_after: float | None = None
) -> UpstreamError:
    """Build the generic upstream failure."""
    return UpstreamError(FAILED, transient=transient, retry_after=retry_after)


def public_address(address: IPAddress) -> bool:
    """Tell whether an address is on the public internet (not ours, not a LAN's)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return public_address(address.ipv4_mapped)
    return address.is_global and not address.is_multicast


class PrivateAddress(OSError):
    """A name resolved to an address no result may come from."""


class GuardedResolver(AbstractResolver):
    """Resolve names, refusing private addresses except for the trusted host.

    The check sits in the resolver, so the address checked is the address
    connected to (a name that resolves anew between check and use cannot slip
    through). IP literals skip resolvers; fetch.py checks those itself.
    """

    def __init__(self, trusted_host: str) -> None:
        self._trusted = trusted_host.lower()
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        """Resolve, then drop the whole answer if any address is private."""
        results = await self._inner.resolve(host, port, family)
        if host.lower() == self._trusted:
            return results
        for result in results:
            address = ipaddress.ip_address(result["host"].split("%")[0])
            if not public_address(address):
                raise PrivateAddress(f"{host} resolves to a non-public address")
        return results

    async def close(self) -> None:
        """Release the inner resolver."""
        await self._inner.close()


@dataclass(frozen=True, slots=True)
class Answer:
    """An upstream's answer, read whole (within a limit)."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    @property
    def ok(self) -> bool:
        """Tell whether the status is 2xx."""
        return 200 <= self.status < 300

    def json(self) -> Any:
        """Parse the body; an answer that is not JSON is a failure, not retried."""
        content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
        if content_type and not content_type.lower().endswith("json"):
            raise failed()
        try:
            return jsonlib.loads(self.body)
        except ValueError:
            raise failed() from None


def retry_after(headers: CIMultiDictProxy[str]) -> float | None:
    """Read Retry-After (seconds or an HTTP date), capped; None when absent."""
    value = headers.get("Retry-After", "").strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=dt.UTC)
        seconds = (when - dt.datetime.now(dt.UTC)).total_seconds()
    if seconds != seconds:  # NaN
        return None
    return min(max(seconds, 0.0), MAX_RETRY_AFTER)


def http_fault(answer: Answer) -> UpstreamError:
    """Map a non-2xx answer the common way: busy or broken is transient."""
    if answer.status in TRANSIENT_STATUSES or answer.status >= 500:
        return failed(transient=True, retry_after=retry_after(answer.headers))
    return failed()


def error_code(answer: Answer) -> str:
    """Read `error.code` (or `code`) from a JSON error body; empty when absent."""
    try:
        body = jsonlib.loads(answer.body)
    except ValueError:
        return ""
    if not isinstance(body, dict):
        return ""
    error = body.get("error")
    code = error.get("code") if isinstance(error, dict) else body.get("code")
    return code if isinstance(code, str) else ""


class UpstreamHttp:
    """One upstream's HTTP session: its base URL, key, limits and timeouts."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        scheme: str = "Bearer",
        timeout: float = 120.0,
        connections: int = CONNECTIONS,
        token: Callable[[], str] | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        parts = urlsplit(self.base_url)
        self.origin = (parts.scheme, (parts.hostname or "").lower(), parts.port)
        self.host = parts.hostname or ""
        self._key = Secret(api_key)
        self._scheme = scheme
        # Mints the credential per request (a signed JWT) instead of the key itself.
        self._token = token
        self.timeout = timeout
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"UpstreamHttp({self.base_url!r})"

    @property
    def has_key(self) -> bool:
        """Tell whether a key is configured."""
        return bool(self._key)

    def auth_headers(self) -> dict[str, str]:
        """The header that carries the key (only ever sent to base_url's origin)."""
        if self._token is not None:
            return {"Authorization": f"{self._scheme} {self._token()}"}
        if not self._key:
            return {}  # a keyless upstream (a self-hosted server)
        return {"Authorization": f"{self._scheme} {self._key.reveal()}"}

    def same_origin(self, url: str) -> bool:
        """Tell whether a URL is on the upstream's own origin (the key may go there)."""
        parts = urlsplit(url)
        return (parts.scheme, (parts.hostname or "").lower(), parts.port) == self.origin

    @property
    def session(self) -> aiohttp.ClientSession:
        """The one session, opened on first use (inside the running loop)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self._connections,
                resolver=GuardedResolver(self.host),
                ttl_dns_cache=60,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=None, connect=min(self.timeout, 15.0), sock_read=self.timeout
                ),
                headers={"User-Agent": "studio/1"},
                auto_decompress=True,
                raise_for_status=False,
            )
        return self._session

    async def call(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        data: Any = None,
        headers: dict[str, str] | None = None,
        limit: int = JSON_LIMIT,
        within: float | None = None,
    ) -> Answer:
        """Send one authorized request to the upstream and read its answer."""
        url = path if path.startswith(("http://", "https://")) else self.base_url + path
        if not self.same_origin(url):
            raise failed()  # the key goes nowhere but the upstream's own origin
        sent = {**self.auth_headers(), **(headers or {})}
        # The session's read timeout is the upstream's; a longer call needs its own.
        options: dict[str, Any] = {}
        if within is not None:
            options["timeout"] = aiohttp.ClientTimeout(
                total=None, connect=min(self.timeout, 15.0), sock_read=within
            )
        try:
            async with asyncio.timeout(within or self.timeout):
                async with self.session.request(
                    method,
                    url,
                    json=json,
                    data=data,
                    headers=sent,
                    allow_redirects=False,
                    **options,
                ) as response:
                    body = await read_limited(response, limit)
                    return Answer(response.status, response.headers, body)
        except (aiohttp.ClientError, OSError, TimeoutError):
            raise failed(transient=True) from None

    async def aclose(self) -> None:
        """Close the session and its connections."""
        if self._session is not None:
            await self._session.close()
            self._session = None


async def read_limited(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """Read a body of at most `limit` bytes; a larger one fails, not retried."""
    declared = response.content_length
    if declared is not None and declared > limit:
        raise failed()
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            raise failed()
        chunks.append(chunk)
    return b"".join(chunks)
