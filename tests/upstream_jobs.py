"""Run generations against a fake upstream: the real app, worker, ledger and Redis.

The app and the worker read the same settings, which point an upstream name at
a fake on loopback (`STUDIO_UPSTREAMS_<NAME>_BASE_URL`, `_API_KEY`). The worker
runs in the test's loop as `studio worker` builds it (the registry of
upstreams from the settings), so the fake serves it while the test awaits; a
test may also start a real worker process with the same variables.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from service.content import Content, load_content
from service.settings import Settings
from service.studio.media.store import DirectoryStore
from service.studio.upstreams.registry import Upstreams
from service.studio.worker import Worker

from .conftest import Client
from .workbench import balance, ledger, wait_for_status

TRIAL: int = 1000


def upstream_env(
    tmp_path: Path, redis_url: str, name: str, base_url: str, key: str
) -> dict[str, str]:
    """Variables shared by the app and its workers: one upstream, on the fake."""
    upper = name.upper()
    return {
        "STUDIO_REDIS_URL": redis_url,
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_JOBS_VISIBILITY_TIMEOUT": "5",
        "STUDIO_TRIAL_CREDITS": str(TRIAL),
        f"STUDIO_UPSTREAMS_{upper}_BASE_URL": base_url,
        f"STUDIO_UPSTREAMS_{upper}_API_KEY": key,
    }


@contextlib.asynccontextmanager
async def running_worker(
    redis: Redis, settings: Settings, content: Content | None = None
) -> AsyncIterator[Worker]:
    """A worker in this loop, built as `studio worker` builds it."""
    upstreams = Upstreams(settings.workbench)
    worker = Worker(
        redis=redis,
        content=content or load_content(),
        settings=settings.workbench,
        media=DirectoryStore(settings.workbench.media_dir),
        upstream_for=upstreams,
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        yield worker
    finally:
        stop.set()
        await task
        await upstreams.aclose()


async def submit(client: Client, **body: Any) -> dict[str, Any]:
    """Submit a generation; it must be accepted (202)."""
    response = await client.post("/api/generations", json=body)
    assert response.status == 202, await response.text()
    generation: dict[str, Any] = await response.json()
    return generation


async def finished(
    client: Client, generation: Mapping[str, Any], within: float = 30.0
) -> dict[str, Any]:
    """Wait until the generation has ended, whichever way."""
    return await wait_for_status(
        client, generation["id"], {"succeeded", "failed", "canceled"}, within
    )


async def assert_books(client: Client, price: int, *, refunded: bool) -> None:
    """One debit of the price and at most one refund, and a balance to match."""
    kinds = [entry["kind"] for entry in await ledger(client)]
    assert kinds == (["grant", "debit", "refund"] if refunded else ["grant", "debit"])
    assert await balance(client) == (TRIAL if refunded else TRIAL - price)


async def until(condition: Callable[[], bool], within: float = 20.0) -> None:
    """Wait until a condition on a fake holds (checked every 20 ms)."""
    for _ in range(int(within / 0.02)):
        if condition():
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the condition never held")
