"""Find the client's address, trusting X-Forwarded-For only from our own proxies."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from functools import lru_cache
from typing import Final

from aiohttp import web

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# One household or small provider customer usually owns a whole IPv6 /64.
IPV6_PREFIX: Final = 64
# The networks whose noise /api/auth/code also counts (see network_of).
IPV4_NETWORK_PREFIX: Final = 24
IPV6_NETWORK_PREFIX: Final = 48


@lru_cache(maxsize=4096)
def parse_ip(text: str) -> IPAddress | None:
    """Parse an address as peers and proxies write it: bare, [v6]:port or v4:port."""
    text = text.strip()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        return address.ipv4_mapped
    return address


def forwarded_client(
    request: web.Request, proxy: IPAddress, trusted: Sequence[IPNetwork]
) -> IPAddress:
    """Return the right-most untrusted X-Forwarded-For hop of a request from a proxy.

    Each proxy appends the address it received the request from, so only the
    right-most entries were written by us; the left ones are whatever the
    client chose to send. Walking from the right past our own proxies gives
    the first address nobody could forge. A malformed hop stops the walk.
    """
    hops = [
        hop
        for value in request.headers.getall("X-Forwarded-For", [])
        for hop in value.split(",")
    ]
    for hop in reversed(hops):
        address = parse_ip(hop)
        if address is None:
            break
        if not any(address in net for net in trusted):
            return address
        proxy = address
    return proxy


def client_address(request: web.Request, trusted: Sequence[IPNetwork]) -> str:
    """Return the client's own address (what a payment provider is told), or ''."""
    peer = parse_ip(request.remote or "")
    if peer is not None and any(peer in net for net in trusted):
        peer = forwarded_client(request, peer, trusted)
    return str(peer) if peer is not None else ""


@lru_cache(maxsize=4096)
def subject_of(address: IPAddress | None) -> str:
    """Name the rate-limit subject of an address: IPv4 as is, IPv6 by its /64."""
    if address is None:
        return "unknown"
    if isinstance(address, ipaddress.IPv4Address):
        return f"ip4:{address}"
    network = ipaddress.IPv6Network(f"{address}/{IPV6_PREFIX}", strict=False)
    return f"ip6:{network.compressed}"


@lru_cache(maxsize=4096)
def network_of(subject: str) -> str:
    """Name the network of a client subject: its IPv4 /24 or IPv6 /48.

    One operator usually holds a whole such network, so a flood from many of
    its addresses shows up as one noisy network.
    """
    kind, _, rest = subject.partition(":")
    if kind == "ip4":
        v4 = ipaddress.IPv4Network(f"{rest}/{IPV4_NETWORK_PREFIX}", strict=False)
        return f"net4:{v4.compressed}"
    if kind == "ip6":
        v6 = ipaddress.IPv6Network(rest).supernet(new_prefix=IPV6_NETWORK_PREFIX)
        return f"net6:{v6.compressed}"
    return "net:unknown"


class ClientNamer:
    """Name a request's rate-limit subject, parsing each direct peer only once.

    The client is the socket peer, unless the peer is one of our proxies. A
    peer that is not is the client whatever headers it sends, so its subject
    depends on nothing but its address text and is kept. Only requests relayed
    by a trusted proxy have their X-Forwarded-For walked.
    """

    def __init__(self, trusted: Sequence[IPNetwork], max_peers: int = 4096) -> None:
        self._trusted = tuple(trusted)
        self._direct: dict[str, str] = {}
        self._max = max_peers

    def subject(self, request: web.Request) -> str:
        """Return the subject of the request's client."""
        remote = request.remote or ""
        if (subject := self._direct.get(remote)) is not None:
            return subject
        peer = parse_ip(remote)
        if peer is not None and any(peer in net for net in self._trusted):
            return subject_of(forwarded_client(request, peer, self._trusted))
        if len(self._direct) >= self._max:
            self._direct.clear()
        subject = self._direct[remote] = subject_of(peer)
        return subject
