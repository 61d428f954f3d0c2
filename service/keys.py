"""Every typed application and request key, in one place."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from aiohttp import web
from redis.asyncio import Redis

from .content import Content
from .limits.limiter import Decision, Limiter
from .settings import Settings

if TYPE_CHECKING:  # the stores import this module; their types are named in quotes
    from .account.deletion import DeletionStore  # noqa: F401
    from .account.exports import ExportStore  # noqa: F401
    from .auth.accounts import AccountStore  # noqa: F401
    from .auth.codes import CodeStore  # noqa: F401
    from .auth.devices import DeviceStore  # noqa: F401
    from .auth.mailer import Mailer  # noqa: F401
    from .auth.sessions import Session, SessionStore  # noqa: F401
    from .clock import Clock  # noqa: F401
    from .metrics import Metrics  # noqa: F401
    from .payments.fake import FakeGateway  # noqa: F401
    from .payments.orders import OrderStore  # noqa: F401
    from .payments.providers.base import Provider  # noqa: F401
    from .square.feed import SquareStore  # noqa: F401
    from .studio.events import EventHub  # noqa: F401
    from .studio.generations import GenerationStore  # noqa: F401
    from .studio.ledger import Ledger  # noqa: F401
    from .studio.media.store import MediaStore  # noqa: F401
    from .studio.queue import JobQueue  # noqa: F401
    from .studio.upstreams.registry import Upstreams  # noqa: F401
    from .studio.works import WorkStore  # noqa: F401
    from .web.headers import SecurityHeaders  # noqa: F401
    from .web.published import Published  # noqa: F401

SETTINGS: Final = web.AppKey("settings", Settings)
CONTENT: Final = web.AppKey("content", Content)
REDIS: Final = web.AppKey("redis", Redis)
MAILER: Final = web.AppKey["Mailer"]("mailer")
CODES: Final = web.AppKey["CodeStore"]("codes")
DEVICES: Final = web.AppKey["DeviceStore"]("devices")
ACCOUNTS: Final = web.AppKey["AccountStore"]("accounts")
# "Delete my account": now, restored on sign-in, purged by a worker (CONTRACT §9).
DELETIONS: Final = web.AppKey["DeletionStore"]("deletions")
# "Export my data": one ZIP a day per account, built by a worker (CONTRACT §9).
EXPORTS: Final = web.AppKey["ExportStore"]("exports")
SESSIONS: Final = web.AppKey["SessionStore"]("sessions")
LIMITER: Final = web.AppKey("limiter", Limiter)
SQUARE: Final = web.AppKey["SquareStore"]("square")
SECURITY: Final = web.AppKey["SecurityHeaders"]("security")
LEDGER: Final = web.AppKey["Ledger"]("ledger")
GENERATIONS: Final = web.AppKey["GenerationStore"]("generations")
JOBS: Final = web.AppKey["JobQueue"]("jobs")
MEDIA: Final = web.AppKey["MediaStore"]("media")
EVENTS: Final = web.AppKey["EventHub"]("events")
UPSTREAMS: Final = web.AppKey["Upstreams"]("upstreams")
WORKS: Final = web.AppKey["WorkStore"]("works")
METRICS: Final = web.AppKey["Metrics"]("metrics")
# What time it is (tests move an app to another day); see service/clock.py.
CLOCK: Final = web.AppKey["Clock"]("clock")
# The public documents as served today, re-rendered when a model retires.
PUBLISHED: Final = web.AppKey["Published"]("published")
ORDERS: Final = web.AppKey["OrderStore"]("orders")
# The payment channels this process can take orders on, by id ("alipay", ...).
PROVIDERS: Final = web.AppKey["dict[str, Provider]"]("providers")
# The fake provider's gateway (only when payments.fake is on; its routes read it).
FAKE_GATEWAY: Final = web.AppKey["FakeGateway"]("fake_gateway")

SESSION: Final = web.RequestKey["Session"]("session")
CLIENT: Final = web.RequestKey("client", str)
# Redis already failed this request (the limiter fell back): do not wait on it again.
DEGRADED: Final = web.RequestKey("degraded", bool)
DECISIONS: Final = web.RequestKey("decisions", list[Decision])
# A value the limiter read for the handler in its own round trip (None: not read).
READ_ALONG: Final = web.RequestKey["bytes | None"]("read_along")
