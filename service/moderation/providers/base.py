"""What every moderation provider offers, and what its answers mean to us."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True, slots=True)
class Verdict:
    """A provider's decision: refused or not, and its label for why."""

    blocked: bool
    label: str = ""


@dataclass(frozen=True, slots=True)
class Picture:
    """An image to check: its bytes, and an absolute URL a provider can fetch it at.

    Tencent takes the bytes; Alibaba Cloud and Volcengine fetch the URL.
    """

    data: bytes
    url: str = ""


class ProviderError(Exception):
    """The provider did not answer usefully (unreachable, slow, an error answer)."""


class Provider(Protocol):
    """A moderation service: the name it is configured by, a text and an image check."""

    name: str

    async def text(self, content: str) -> Verdict:
        """Check a text (a prompt)."""
        ...

    async def image(self, picture: Picture) -> Verdict:
        """Check an image (an output, a video's poster, an upload)."""
        ...
