"""The provider `moderation.provider` names, built from its settings."""

from __future__ import annotations

import importlib
import ipaddress
from collections.abc import Callable
from typing import Final, cast
from urllib.parse import urlsplit

from ...settings import ModerationSettings, Settings
from .base import Provider

# moderation.provider -> the class in the module of its name; a process imports
# only the one its settings name.
PROVIDERS: Final = {
    "aliyun": "Aliyun",
    "tencent": "Tencent",
    "volcengine": "Volcengine",
}


# The providers that fetch images by URL instead of taking their bytes.
BY_URL: Final = frozenset({"aliyun", "volcengine"})


def _local(host: str) -> bool:
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_private or address.is_link_local


def fetch_warning(settings: Settings) -> str | None:
    """Say so when the provider would fetch images where the internet can't reach."""
    workbench = settings.workbench
    if workbench.moderation.provider not in BY_URL:
        return None
    if workbench.media_s3 is not None:
        origin, named = workbench.media_s3.endpoint, "media.s3_endpoint"
    else:
        origin = workbench.media_public_url or settings.base_url
        named = "media.public_url" if workbench.media_public_url else "base_url"
    host = urlsplit(origin).hostname or ""
    if not origin or not _local(host):
        return None
    return (
        f"moderation provider {workbench.moderation.provider} fetches images by URL,"
        f" but {named} ({host}) is not reachable from the internet"
    )


def provider_for(settings: ModerationSettings) -> Provider | None:
    """Return the configured provider, or None for `none`."""
    name = PROVIDERS.get(settings.provider)
    if name is None:
        return None
    module = importlib.import_module(f"{__package__}.{settings.provider}")
    build = cast(Callable[[ModerationSettings], Provider], getattr(module, name))
    return build(settings)
