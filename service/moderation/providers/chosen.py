"""The provider `moderation.provider` names, built from its settings."""

from __future__ import annotations

from typing import Final

from ...settings import ModerationSettings
from .aliyun import Aliyun
from .base import Provider
from .tencent import Tencent

# Each takes the same settings: its key pair, region, endpoint and timeout.
PROVIDERS: Final[dict[str, type[Aliyun] | type[Tencent]]] = {
    "aliyun": Aliyun,
    "tencent": Tencent,
}


def provider_for(settings: ModerationSettings) -> Provider | None:
    """Return the configured provider, or None for `none`."""
    kind = PROVIDERS.get(settings.provider)
    if kind is None:
        return None
    return kind(
        key_id=settings.access_key_id,
        secret=settings.access_key_secret,
        region=settings.region,
        endpoint=settings.endpoint,
        timeout=settings.timeout,
    )
