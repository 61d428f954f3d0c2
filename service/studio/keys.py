"""The workbench's keys: its stores, its media, its routing and its events."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from aiohttp import web

from .events import EventHub
from .generations import GenerationStore
from .ledger import Ledger
from .media.store import MediaStore
from .positions import Positions
from .queue import JobQueue
from .upstreams.registry import Routing
from .works import WorkStore

LEDGER: Final = web.AppKey("ledger", Ledger)
GENERATIONS: Final = web.AppKey("generations", GenerationStore)
JOBS: Final = web.AppKey("jobs", JobQueue)
MEDIA: Final = web.AppKey("media", MediaStore)
EVENTS: Final = web.AppKey("events", EventHub)
# Which models take jobs; the adapters are the workers' (`Upstreams`).
ROUTING: Final = web.AppKey("routing", Routing)
WORKS: Final = web.AppKey("works", WorkStore)
POSITIONS: Final = web.AppKey("positions", Positions)
# How an account's event stream shows each kind of event it relays, by name;
# the concerns above the studio add their own ("order": payments).
EVENT_VIEWS: Final = web.AppKey(
    "event_views", dict[str, Callable[[dict[str, Any]], dict[str, Any]]]
)
