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
import importlib
from collections.abc import Callable, Mapping
from typing import Any, Final, cast

from ...content import Model
from ...settings import UpstreamSettings, WorkbenchSettings
from .base import Output, Progress, Request, Upstream, UpstreamError
from .demo import DemoUpstream

Adapter = Callable[[UpstreamSettings], Upstream]
# (the model, the submitted body) -> the field its protocol cannot honour, or None.
Check = Callable[[Model, Mapping[str, Any]], "str | None"]

# Each protocol is spoken by the adapter module of its name, whose `upstream`
# builds the adapter. A module is imported only when an upstream of its
# protocol is configured, and `serve` builds no adapter: it only routes.
PROTOCOLS: Final = frozenset(
    {"openai", "fal", "replicate", "ark", "dashscope", "kling", "minimax", "comfyui"}
)
# Protocols whose upstream needs no key (a self-hosted server): a base_url is enough.
KEYLESS: Final = frozenset({"comfyui"})
# Protocols whose module's `refused_field` names a submitted field it cannot honour.
CHECKED: Final = frozenset({"openai", "fal", "replicate", "kling"})


def _module_attribute(protocol: str, name: str) -> object:
    """Return `name` of a protocol's adapter module, importing it now."""
    return getattr(importlib.import_module(f"{__package__}.{protocol}"), name)


def _routed(config: UpstreamSettings) -> bool:
    """Tell whether an upstream gets an adapter: a protocol, and its credentials."""
    if config.protocol == "demo":
        return True
    return config.protocol in PROTOCOLS and bool(
        config.api_key or (config.protocol in KEYLESS and config.base_url)
    )


class Routing:
    """Which models can take jobs and which fields they refuse; no adapters.

    What `serve` needs of the upstreams to take a submit: a worker runs jobs
    with `Upstreams`, which adds the adapters.
    """

    def __init__(self, settings: WorkbenchSettings) -> None:
        self._demo = settings.demo_upstream
        self._configs = settings.upstreams
        self._routed = frozenset(
            name for name, config in settings.upstreams.items() if _routed(config)
        )
        self._checks = {
            name: cast(Check, _module_attribute(config.protocol, "refused_field"))
            for name, config in settings.upstreams.items()
            if config.protocol in CHECKED and not self._demo
        }

    def available(self, model: Model, today: dt.date | None = None) -> bool:
        """Tell whether a model can take jobs now: not retired, and routed."""
        if model.retired(today or dt.datetime.now(dt.UTC).date()):
            return False
        return self._demo or model.upstream in self._routed

    def refused_field(self, model: Model, asked: Mapping[str, Any]) -> str | None:
        """Name a submitted field the model's upstream cannot honour, if any."""
        check = self._checks.get(model.upstream)
        return check(model, asked) if check else None


class Unconfigured:
    """Stands for an upstream without credentials: every job fails, refunded."""

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Refuse: submit already refuses unavailable models, so this is a race."""
        raise UpstreamError("UPSTREAM_FAILED", transient=False)

    async def aclose(self) -> None:
        """Nothing to release."""


class Upstreams(Routing):
    """Every model routed to its upstream; with the demo on, all go to the demo."""

    def __init__(self, settings: WorkbenchSettings) -> None:
        super().__init__(settings)
        self._demo_upstream = (
            DemoUpstream(settings.demo_seconds) if settings.demo_upstream else None
        )
        self._none = Unconfigured()
        self._adapters: dict[str, Upstream] = {}
        for name, config in settings.upstreams.items():
            if name not in self._routed:
                continue
            if config.protocol == "demo":
                self._adapters[name] = DemoUpstream(settings.demo_seconds)
            else:
                build = cast(Adapter, _module_attribute(config.protocol, "upstream"))
                self._adapters[name] = build(config)

    def __call__(self, model: Model) -> Upstream:
        """Return the upstream of a model."""
        if self._demo_upstream is not None:
            return self._demo_upstream
        return self._adapters.get(model.upstream, self._none)

    async def aclose(self) -> None:
        """Close every upstream's connections."""
        if self._demo_upstream is not None:
            await self._demo_upstream.aclose()
        for adapter in self._adapters.values():
            await adapter.aclose()
