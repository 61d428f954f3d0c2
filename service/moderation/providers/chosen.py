"""The provider `moderation.provider` names, built from its settings."""

from __future__ import annotations

from typing import Final

from ...settings import ModerationSettings
from .aliyun import Aliyun
from .base import Provider
from .tencent import Tencent
from .volcengine import Volcengine

PROVIDERS: Final[dict[str, type[Aliyun] | type[Tencent] | type[Volcengine]]] = {
    "aliyun": Aliyun,
    "tencent": Tencent,
    "volcengine": Volcengine,
}


def provider_for(settings: ModerationSettings) -> Provider | None:
    """Return the configured provider, or None for `none`."""
    kind = PROVIDERS.get(settings.provider)
    return None if kind is None else kind(settings)
