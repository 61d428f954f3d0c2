"""What each provider's client shares: its keys, and one POST answered in JSON."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import aiohttp

from ...settings import ModerationSettings
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
    """A provider's client from `moderation.*`: keys, region, endpoint, timeout."""

    region: ClassVar[str] = ""  # the provider's default region

    def __init__(self, settings: ModerationSettings) -> None:
        self._id = settings.access_key_id
        self._secret = settings.access_key_secret
        self._region = settings.region or self.region
        self._endpoint = settings.endpoint
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout)
        self._settings = settings

    def __repr__(self) -> str:
        return f"{type(self).__name__}(region={self._region!r})"  # never the key


def coded(answer: Any, ok: int, what: str) -> dict[str, Any]:
    """The JSON object whose `Code` says success; else ProviderError naming the code."""
    if not isinstance(answer, dict) or answer.get("Code") != ok:
        code = answer.get("Code") if isinstance(answer, dict) else None
        raise ProviderError(f"{what}: {code or 'malformed answer'}")
    return answer


def decided(
    data: Any, field: str, values: tuple[str, ...], what: str
) -> tuple[str, dict[str, Any]]:
    """The verdict a provider's `Data` holds in `field` (a known value), and `Data`."""
    value = data.get(field) if isinstance(data, dict) else None
    if not isinstance(data, dict) or value not in values:
        raise ProviderError(f"{what}: no {field}")
    return str(value), data
