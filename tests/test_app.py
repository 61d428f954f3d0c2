"""The factory's start-up hook for production entry points."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import contextmanager

from service.app import YOUNG_COLLECTION_THRESHOLD, freeze_startup_objects

from .conftest import Client


@contextmanager
def young_collections() -> Iterator[list[int]]:
    """Count the collections of the youngest generation while inside."""
    seen: list[int] = []

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start" and info["generation"] == 0:
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


async def _burst(client: Client, size: int) -> None:
    requests = (client.get("/api/square") for _ in range(size))
    responses = await asyncio.gather(*requests)
    for response in responses:
        assert response.status == 200
        await response.read()


async def test_a_burst_of_requests_after_start_up_runs_no_collection(
    client: Client,
) -> None:
    """Python's default collects the young generation inside one burst of
    requests (walking every request in flight); after start-up the same burst
    runs no collection."""
    threshold = gc.get_threshold()
    try:
        await _burst(client, 5)  # first requests build what later ones reuse
        with young_collections() as seen:
            await _burst(client, 20)
        await freeze_startup_objects(client.app)
        assert gc.get_threshold()[0] == YOUNG_COLLECTION_THRESHOLD
        with young_collections() as after:
            await _burst(client, 20)
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert seen, "the burst is too small to show the default's collections"
    assert not after
