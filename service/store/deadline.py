"""Answer within a budget even when the operation's own cleanup is slow."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Final, TypeVar

T = TypeVar("T")
# Operations abandoned at their deadline, kept alive until they finish on their own.
_ABANDONED: Final[set[asyncio.Future[object]]] = set()


def _reap(future: asyncio.Future[object]) -> None:
    _ABANDONED.discard(future)
    if not future.cancelled():
        future.exception()  # retrieved: an abandoned failure is expected, not news


async def within(seconds: float, operation: Awaitable[T]) -> T:
    """Return the operation's result, or raise TimeoutError after `seconds`.

    Cancelling a Redis call mid-flight makes the client close its connection,
    which can itself wait on a silent peer; the caller should not. A late
    operation is left to finish (or time out at the socket) in the background.
    """
    future = asyncio.ensure_future(operation)
    try:
        return await asyncio.wait_for(asyncio.shield(future), seconds)
    except TimeoutError:
        _ABANDONED.add(future)  # type: ignore[arg-type]
        future.add_done_callback(_reap)  # type: ignore[arg-type]
        raise
