"""What each provider's client shares: its keys, and one POST answered in JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp

from .base import ProviderError


async def post_json(
    url: str,
    *,
    body: bytes,
    headers: Mapping[str, str],
    within: aiohttp.ClientTimeout,
    what: str,
) -> Any:
    """POST the body; return the decoded answer, whatever its status."""
    try:
        async with (
            aiohttp.ClientSession(timeout=within) as http,
            http.post(url, data=body, headers=headers) as reply,
        ):
            return await reply.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        raise ProviderError(f"{what}: {type(err).__name__}") from err


class KeyedClient:
    """A provider's client: its key pair, region, endpoint and per-call timeout."""

    region: ClassVar[str] = ""  # the provider's default region

    def __init__(
        self, *, key_id: str, secret: str, region: str, endpoint: str, timeout: float
    ) -> None:
        self._id = key_id
        self._secret = secret
        self._region = region or self.region
        self._endpoint = endpoint
        self._timeout = aiohttp.ClientTimeout(total=timeout)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(region={self._region!r})"  # never the key
