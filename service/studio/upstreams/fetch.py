"""Download a result safely: bounded in size, checked in type, never from a LAN.

An upstream answers with a URL (or base64) of what it made; before those bytes
reach the media store they must be what we asked for. So a download:
refuses an address that is private, loopback, link-local or multicast (the
upstream's own base_url host excepted, so a fake upstream on loopback works),
checks every redirect hop the same way (at most MAX_REDIRECTS), refuses a body
declared or grown over the kind's limit, refuses HTML/JSON/text where media is
expected, and keeps the bytes only when their magic says PNG, JPEG or WebP
(image) or an MP4 `ftyp` box (video). The key is sent only to the upstream's
own origin. Every refusal is UPSTREAM_FAILED, not retried; a transport error or
a 5xx/429 is transient.

API (for the protocol adapters):
    output = await fetch_result(http, url, kind="image")   # http: UpstreamHttp
    output = decode_base64(text, kind="image")             # b64_json, data: URLs
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
from typing import Final, Literal
from urllib.parse import urljoin, urlsplit

import aiohttp

from ...labels.carriers import sniff as sniff  # the type by its first bytes
from .base import Output
from .http import (
    TRANSIENT_STATUSES,
    PrivateAddress,
    UpstreamHttp,
    failed,
    public_address,
    read_limited,
    retry_after,
)

Kind = Literal["image", "video"]

LIMITS: Final[dict[Kind, int]] = {"image": 50 * 1024 * 1024, "video": 500 * 1024 * 1024}
MAX_REDIRECTS: Final = 3
# Types that are never media, whatever the body's first bytes say.
_NOT_MEDIA: Final = ("text/", "application/json", "application/xml", "html", "svg")


def checked(data: bytes, kind: Kind) -> Output:
    """Keep bytes only when they are media of the expected kind."""
    if len(data) > LIMITS[kind]:
        raise failed()
    extension = sniff(data)
    if extension is None or (extension == "mp4") != (kind == "video"):
        raise failed()
    return Output(data, extension)


def decode_base64(text: object, kind: Kind) -> Output:
    """Decode a base64 result (or a data: URL) and check it like a download."""
    if not isinstance(text, str):
        raise failed()
    if text.startswith("data:"):
        header, _, text = text.partition(",")
        if not header.endswith(";base64"):
            raise failed()
    if len(text) * 3 // 4 > LIMITS[kind]:
        raise failed()
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise failed() from None
    return checked(data, kind)


def _check_url(http: UpstreamHttp, url: str) -> None:
    """Refuse a URL that is not http(s), or names a non-public IP literally."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host or parts.username:
        raise failed()
    if host == http.host.lower():
        return
    try:
        address = ipaddress.ip_address(host.split("%")[0])
    except ValueError:
        return  # a name: the session's resolver checks where it leads
    if not public_address(address):
        raise failed()


async def fetch_result(http: UpstreamHttp, url: str, kind: Kind) -> Output:
    """Download one result within its kind's limit and check what it is."""
    if url.startswith("data:"):
        return decode_base64(url, kind)
    limit = LIMITS[kind]
    for _ in range(MAX_REDIRECTS + 1):
        _check_url(http, url)
        headers = http.auth_headers() if http.same_origin(url) else {}
        try:
            async with http.session.get(
                url, headers=headers, allow_redirects=False
            ) as response:
                if response.status in (301, 302, 303, 307, 308):
                    location = response.headers.get("Location")
                    if not location:
                        raise failed()
                    url = urljoin(url, location)
                    continue
                if response.status in TRANSIENT_STATUSES or response.status >= 500:
                    raise failed(
                        transient=True, retry_after=retry_after(response.headers)
                    )
                if response.status != 200:
                    raise failed()
                content_type = response.headers.get("Content-Type", "").lower()
                if any(marker in content_type for marker in _NOT_MEDIA):
                    raise failed()
                return checked(await read_limited(response, limit), kind)
        except aiohttp.InvalidURL:
            raise failed() from None
        except aiohttp.ClientConnectorError as err:
            # The resolver refused a private address: that is a refusal.
            transient = not isinstance(err.os_error, PrivateAddress)
            raise failed(transient=transient) from None
        except (aiohttp.ClientError, OSError, TimeoutError):
            raise failed(transient=True) from None
    raise failed()  # too many redirects
