"""Real servers for the tests: Redis-compatible and SMTP, on free ports."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer
from redis.asyncio import Redis

from service.app import create_app
from service.auth.sessions import SESSIONS
from service.settings import Settings, load_settings
from service.store.connect import connect
from service.store.embedded import MailCatcher, RedisServer

from .cluster import Cluster
from .ports import STORE_PRIORITY, free_port

if TYPE_CHECKING:  # tests/shop.py imports this module
    from .shop import Shop

TEST_SECRET = "test-secret-key-0123456789abcdef-0123456789"

AppFactory = Callable[..., web.Application]
SettingsFactory = Callable[..., Settings]
# Tests that are not about limits should not trip the per-address limits by accident.
GENEROUS_LIMITS = {
    f"STUDIO_LIMITS_{name}_{field}": value
    for name in ("CODE_IP", "CODE_NET", "CODE_NET_FREE", "VERIFY_IP", "GALLERY")
    for field, value in (("QUOTA", "100000"), ("BURST", "50000"))
}
Client = TestClient[web.Request, web.Application]
# Lines a test module asks the terminal summary to show (e.g. how many cases ran).
SUMMARY = pytest.StashKey[list[str]]()


# The longest modules (about 15-70 s each on one of four processes, mostly waiting
# on worker processes, vendor fakes and browsers), longest first, as measured with
# `pytest -v` timestamps. `make suite` hands modules out in collection order
# (--no-loadscope-reorder), so these start first instead of wherever the alphabet
# puts them (most are test_up*, near the end) and no process is left finishing
# one long module alone.
LONGEST_FIRST: Final = (
    "test_upstream_vendors.py",
    "test_moderation_providers.py",
    "test_upstream_openai.py",
    "test_browser_workbench.py",
    "test_internal_fuzz.py",
    "test_upstream_fal.py",
    "test_upstream_ark.py",
    "test_browser.py",
    "test_proxy_cache.py",
    "test_upstream_comfyui.py",
    "test_cluster.py",
    "test_upstream_replicate.py",
    "test_documents.py",
    "test_payments_alipay.py",
    "test_account_export.py",
    "test_upstream_slots.py",
    "test_orders_property.py",
    "test_negotiation.py",
    "test_browser_payments.py",
    "test_supervisor.py",
    "test_browser_account.py",
    "test_moderation_sanctions.py",
)


# The timing part's two processes (`make timing`): each starts with one module that
# waits out a 10 s timeout on a thousand held connections, so those two never set
# their thousand up at once, and the rest follow longest first.
TIMING_FIRST: Final = (
    "test_slow_clients.py",
    "test_loop_lateness.py",
    "test_front_proxy.py",
    "test_challenge.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the longest modules first; every other module keeps its place."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    timing = {name: index for index, name in enumerate(TIMING_FIRST)}

    def order(item: pytest.Item) -> int:
        if item.get_closest_marker("timing") is not None:
            return timing.get(item.path.name, len(timing))
        return rank.get(item.path.name, len(rank))

    items.sort(key=order)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """Show the lines test modules left for the summary, once the run is over."""
    for line in config.stash.get(SUMMARY, []):
        terminalreporter.write_line(line)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """On an xdist worker, hand the summary lines to the controller that prints."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["summary"] = session.config.stash.get(SUMMARY, [])


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object) -> None:
    """Collect a finished xdist worker's summary lines for the terminal summary."""
    lines = getattr(node, "workeroutput", {}).get("summary", [])
    node.config.stash.setdefault(SUMMARY, []).extend(lines)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """Start one Redis-compatible server (no persistence) for the whole run."""
    with RedisServer(port=free_port(), priority=STORE_PRIORITY) as server:
        yield server


@pytest.fixture(scope="session")
def mail_server() -> Iterator[MailCatcher]:
    """Start one aiosmtpd server that keeps every message it receives."""
    with MailCatcher(port=free_port()) as catcher:
        yield catcher


@pytest.fixture(scope="session")
def cluster_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One Redis Cluster per test process (6 s to form); the failover test heals it."""
    servers = Cluster(tmp_path_factory.mktemp("cluster"))
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


@pytest.fixture
def cluster(cluster_servers: Cluster) -> Cluster:
    """A three-master cluster with one replica each, emptied for this test."""
    cluster_servers.flush()
    return cluster_servers


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """Give a client on a flushed database."""
    # The service's own factory: its connections keep a task's cancellation
    # (store/cancel_safe.py), which tests of timeouts and cancels rely on.
    client = connect(
        redis_server.url, cluster=False, socket_timeout=5, connect_timeout=5
    )
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture
def make_settings(
    redis_server: RedisServer, mail_server: MailCatcher
) -> SettingsFactory:
    """Load settings the way production does, from default.toml plus variables."""

    def factory(**variables: str) -> Settings:
        environ = {
            "STUDIO_REDIS_URL": redis_server.url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            **GENEROUS_LIMITS,
            **variables,
        }
        return load_settings(environ)

    return factory


@pytest.fixture
def settings(make_settings: SettingsFactory) -> Settings:
    """Settings for the default test app."""
    return make_settings()


@pytest.fixture
async def client(
    aiohttp_client: AiohttpClient, settings: Settings, redis: Redis
) -> Client:
    """A test client on the real app from the factory, over an empty database."""
    return await aiohttp_client(create_app(settings))


async def listening(client: Client) -> None:
    """Wait until the app hears ended sessions (its listener subscribed)."""
    for _ in range(500):
        if client.app[SESSIONS].cache.listening:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the session-end listener never subscribed")


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Keep a full collection over earlier tests' garbage out of a timed section."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def forget_limits(redis: Redis) -> None:
    """Empty every rate-limit bucket: what waiting out the cooldown would do."""
    async for key in redis.scan_iter("studio:rl:*"):
        await redis.delete(key)


def latest_code(mail_server: MailCatcher, to: str) -> str:
    """Read the code out of the newest message the SMTP server got for an address."""
    import re

    for message in reversed(mail_server.messages):
        if message["To"] == to:
            body = message.get_body(preferencelist=("plain",))
            assert body is not None
            match = re.search(r"\b(\d{4}) (\d{4})\b", body.get_content())
            assert match, "the code is shown as 1234 5678"
            return match.group(1) + match.group(2)
    raise AssertionError(f"no message to {to}")


@pytest.fixture
async def shop(
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    redis: Redis,
    mail_server: MailCatcher,
) -> AsyncIterator[Shop]:
    """The real app with both channels aimed at a fake provider; signed in."""
    from .shop import open_shop
    from .workbench import sign_in

    async with open_shop(aiohttp_server, aiohttp_client, make_settings, redis) as shop:
        await sign_in(shop.client, mail_server)
        yield shop


# Settings as variables, and a factory of clients on their own real app.
Env = dict[str, str]
MakeClient = Callable[..., Awaitable[Client]]


@pytest.fixture
def studio_env(tmp_path: Path, redis_server: RedisServer) -> Env:
    """Settings shared by the app and its workers: the demo upstream, one media dir."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.5",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_JOBS_VISIBILITY_TIMEOUT": "2",
    }


@pytest.fixture
def studio(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    redis: Redis,
) -> MakeClient:
    """Build a client on the real app with the workbench settings (and extras)."""

    async def factory(**extra: str) -> Client:
        settings = make_settings(**{**studio_env, **extra})
        return await aiohttp_client(create_app(settings))

    return factory
