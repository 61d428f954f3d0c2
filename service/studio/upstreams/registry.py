"""Pick the upstream that runs a model: one adapter per configured upstream.

Settings name the upstreams (`[upstreams.NAME]`: protocol, base_url, api_key);
each model of content/models.toml names its upstream. An upstream without a
key (a keyless one, comfyui: without a base_url) gets no adapter, so its
models are unavailable; with the demo on, every
model runs on the demo. A protocol's `refused_field` lets submit refuse, before
charging, a field that protocol cannot honour.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any, Final

from ...content import Model
from ...settings import UpstreamSettings, WorkbenchSettings
from . import ark, comfyui, dashscope, fal, kling, minimax, openai, replicate
from .base import Output, Progress, Request, Upstream, UpstreamError
from .demo import DemoUpstream

Adapter = Callable[[UpstreamSettings], Upstream]
# (the model, the submitted body) -> the field its protocol cannot honour, or None.
Check = Callable[[Model, Mapping[str, Any]], "str | None"]

# protocol -> the adapter that speaks it (fal and replicate register here too).
ADAPTERS: Final[dict[str, Adapter]] = {
    "openai": openai.OpenAIUpstream,
    "fal": fal.upstream,
    "replicate": replicate.upstream,
    "ark": ark.upstream,
    "dashscope": dashscope.upstream,
    "kling": kling.upstream,
    "minimax": minimax.upstream,
    "comfyui": comfyui.upstream,
}
# Protocols whose upstream needs no key (a self-hosted server): a base_url is enough.
KEYLESS: Final = frozenset({"comfyui"})
# protocol -> which submitted field it cannot honour.
CHECKS: Final[dict[str, Check]] = {
    "openai": lambda model, asked: openai.refused_field(asked),
    "fal": fal.refused_field,
    "replicate": replicate.refused_field,
}


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
        self._configs = settings.upstreams
        self._adapters: dict[str, Upstream] = {}
        for name, config in settings.upstreams.items():
            if config.protocol == "demo":
                self._adapters[name] = DemoUpstream(settings.demo_seconds)
            elif config.protocol in ADAPTERS and (
                config.api_key or (config.protocol in KEYLESS and config.base_url)
            ):
                self._adapters[name] = ADAPTERS[config.protocol](config)

    def available(self, model: Model, today: dt.date | None = None) -> bool:
        """Tell whether a model can take jobs now: not retired, and routed."""
        if model.retired(today or dt.datetime.now(dt.UTC).date()):
            return False
        return self._demo is not None or model.upstream in self._adapters

    def refused_field(self, model: Model, asked: Mapping[str, Any]) -> str | None:
        """Name a submitted field the model's upstream cannot honour, if any."""
        config = self._configs.get(model.upstream)
        if self._demo is not None or config is None:
            return None
        check = CHECKS.get(config.protocol)
        return check(model, asked) if check else None

    def __call__(self, model: Model) -> Upstream:
        """Return the upstream of a model."""
        if self._demo is not None:
            return self._demo
        return self._adapters.get(model.upstream, self._none)

    async def aclose(self) -> None:
        """Close every upstream's connections."""
        if self._demo is not None:
            await self._demo.aclose()
        for adapter in self._adapters.values():
            await adapter.aclose()
