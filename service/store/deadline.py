"""Answer within a budget of the peer's time, not of the event loop's."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, TypeVar

T = TypeVar("T")
# Once a budget is spent, the verdict waits for one more timer this far ahead, so
# the loop first reads and runs whatever answer came in while it was busy.
SETTLE_SECONDS: Final = 0.005
# A timer this late means the loop was stalled (a collection, another coroutine's
# CPU work, a busy machine), not that the peer was slow.
STALL_SECONDS: Final = 0.01
# However stalled the loop keeps getting, a deadline gives up after this many
# budgets.
PATIENCE: Final = 10
# Operations abandoned at their deadline, kept alive until they finish on their own.
_ABANDONED: Final[set[asyncio.Future[Any]]] = set()
# The deadline of the operation in progress, told when its request is out.
_SENT: Final[ContextVar[Callable[[], None] | None]] = ContextVar("sent", default=None)


class Deadline:
    """Call `expire` once `seconds` have passed and the loop has read its sockets.

    After a stall, a timer and a reply that arrived during the stall become
    ready together, and the timer's callback can run before the task that reads
    the reply (asyncio runs it first; uvloop runs timers before it even polls).
    So a spent budget starts a short settle period instead of a verdict, and a
    settle timer that fires late (the loop stalled again) starts another. A
    settle timer on time expires, after the tasks already woken have had their
    turn; after PATIENCE budgets, a late one does too.

    The budget counts from the request, not from before it: once the operation
    writes its first command (see `counted_from_send`), the budget starts again
    from that moment, once. Taking a connection, packing the command and
    waiting for the CPU before the write are the client's own time; a peer that
    never accepts or never lets the command out still fails at the first budget.
    """

    def __init__(self, seconds: float, expire: Callable[[], object]) -> None:
        self._loop = asyncio.get_running_loop()
        self._seconds = seconds
        self._expire = expire
        self._give_up = self._loop.time() + seconds * PATIENCE
        self._handle: asyncio.Handle = self._loop.call_later(seconds, self._settle)
        self._sent = False
        self._fired = False

    def _settle(self) -> None:
        due = self._loop.time() + SETTLE_SECONDS
        self._handle = self._loop.call_at(due, self._verdict, due)

    def _verdict(self, due: float) -> None:
        now = self._loop.time()
        if now - due > STALL_SECONDS and now < self._give_up:
            self._settle()
        else:
            # Queued behind the steps of tasks whose replies were already read.
            self._handle = self._loop.call_soon(self._fire)

    def _fire(self) -> None:
        self._fired = True
        self._expire()

    def sent(self) -> None:
        """Start the budget again now, once: the request has just gone out."""
        if self._sent or self._fired:
            return
        self._sent = True
        self._handle.cancel()
        self._handle = self._loop.call_later(self._seconds, self._settle)

    def cancel(self) -> None:
        """Stop the deadline: the operation has finished."""
        self._handle.cancel()


@contextmanager
def counted_from_send(deadline: Deadline) -> Iterator[None]:
    """Let the store connections this task (or a task made inside) writes on
    restart the deadline at their first write (`request_sent`)."""
    token = _SENT.set(deadline.sent)
    try:
        yield
    finally:
        _SENT.reset(token)


def request_sent() -> None:
    """Tell the deadline of the operation in progress, if any, its request is out."""
    if (sent := _SENT.get()) is not None:
        sent()


def sent_callback() -> Callable[[], None] | None:
    """What `request_sent` would call now, for a request written later."""
    return _SENT.get()


def _reap(future: asyncio.Future[Any]) -> None:
    _ABANDONED.discard(future)
    if not future.cancelled():
        future.exception()  # retrieved: an abandoned failure is expected, not news


def _abandon(future: asyncio.Future[Any]) -> None:
    _ABANDONED.add(future)
    future.add_done_callback(_reap)


async def within(seconds: float, operation: Awaitable[T]) -> T:
    """Return the operation's result, or raise TimeoutError after `seconds`.

    The seconds are the peer's: a result that has arrived is used even if the
    loop was too busy to notice it in time (see Deadline). Cancelling a Redis
    call mid-flight makes the client close its connection, which can itself
    wait on a silent peer; the caller should not. A late operation is left to
    finish (or time out at the socket) in the background.
    """
    waiter = asyncio.get_running_loop().create_future()

    def wake(_: object = None) -> None:
        if not waiter.done():
            waiter.set_result(None)

    deadline = Deadline(seconds, wake)
    with counted_from_send(deadline):  # the operation's task starts with it set
        future = asyncio.ensure_future(operation)
    future.add_done_callback(wake)
    try:
        await waiter
    finally:
        deadline.cancel()
        future.remove_done_callback(wake)
        if not future.done():
            _abandon(future)
    if future.done():
        return future.result()
    raise TimeoutError(f"no answer within {seconds} s")


@contextmanager
def patiently(seconds: float) -> Iterator[None]:
    """Like `asyncio.timeout`, but the seconds are the peer's (see Deadline).

    For code that cannot be left running in the background, as `within` does:
    the task is cancelled at the deadline and TimeoutError raised in its place.
    """
    task = asyncio.current_task()
    if task is None:
        raise RuntimeError("patiently() is used inside a task")
    # As asyncio.timeout: a task already being canceled (cleaning up after a
    # cancel) still gets its TimeoutError, and a cancel from outside stays one.
    before = task.cancelling()
    expired = False

    def expire() -> None:
        nonlocal expired
        expired = True
        task.cancel()

    deadline = Deadline(seconds, expire)
    try:
        yield
    except asyncio.CancelledError:
        if expired and task.uncancel() <= before:
            raise TimeoutError(f"no answer within {seconds} s") from None
        raise
    finally:
        deadline.cancel()
