"""Pick the upstream that runs a model."""

from __future__ import annotations

from ...content import Model
from ...settings import WorkbenchSettings
from .base import Output, Progress, Request, Upstream, UpstreamError
from .demo import DemoUpstream


class Unconfigured:
    """Stands for an upstream without credentials: every job fails, refunded."""

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Refuse: submit already refuses unavailable models, so this is a race."""
        raise UpstreamError("UPSTREAM_FAILED", transient=False)

    async def aclose(self) -> None:
        """Nothing to release."""


class Upstreams:
    """Every model routed to its upstream; with the demo on, all go to the demo."""

    def __init__(self, settings: WorkbenchSettings) -> None:
        self._demo = (
            DemoUpstream(settings.demo_seconds) if settings.demo_upstream else None
        )
        self._none = Unconfigured()

    def available(self, model: Model) -> bool:
        """Tell whether a model's upstream can take jobs now."""
        return self._demo is not None

    def __call__(self, model: Model) -> Upstream:
        """Return the upstream of a model."""
        return self._demo if self._demo is not None else self._none

    async def aclose(self) -> None:
        """Close every upstream's connections."""
        if self._demo is not None:
            await self._demo.aclose()
