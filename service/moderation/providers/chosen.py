"""The provider `moderation.provider` names, built from its settings."""

from __future__ import annotations

from ...settings import ModerationSettings
from .base import Provider
from .tencent import Tencent


def provider_for(settings: ModerationSettings) -> Provider | None:
    """Return the configured provider, or None for `none`."""
    if settings.provider == "tencent":
        return Tencent(
            secret_id=settings.access_key_id,
            secret_key=settings.access_key_secret,
            region=settings.region,
            endpoint=settings.endpoint,
            timeout=settings.timeout,
        )
    return None
