"""The one interface every model upstream speaks, whatever its protocol.

A real protocol maps onto `generate` like this: submit the request, then poll
(or wait on) the vendor's job, calling `progress` as it moves; fetch the
result; and when the task is cancelled (the person canceled, the deadline
passed, the worker is shutting down) tell the vendor to cancel before letting
the CancelledError go on. Failures are UpstreamError: transient ones are
retried by the worker with backoff within the job's deadline, refusals fail
the generation at once.

A vendor task, once accepted, is the job's: its id goes into `request.memo`
before the first poll, so a retry, a re-delivery or another worker after a
SIGKILL recalls and polls it instead of paying for a second one (tasks.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

Progress = Callable[[float], Awaitable[None]]


class TaskMemo(Protocol):
    """Where one job keeps the id of the vendor task it paid for."""

    # Set by a worker that is shutting down: the task stays the job's (not canceled).
    handing_back: bool

    async def recall(self) -> str | None:
        """Return the task this job already created, if any."""

    async def keep(self, task: str) -> None:
        """Remember the task the vendor accepted, before it is polled."""


class LocalMemo:
    """A memo in this process only (a single call, a unit test)."""

    def __init__(self) -> None:
        self.handing_back = False
        self.task: str | None = None

    async def recall(self) -> str | None:
        """Return the kept task."""
        return self.task

    async def keep(self, task: str) -> None:
        """Keep the task in memory."""
        self.task = task


@dataclass(frozen=True, slots=True)
class Request:
    """What one generation asks of a model, in our own terms."""

    model: str
    upstream_model: str
    kind: Literal["image", "video"]
    prompt: str
    negative_prompt: str
    width: int
    height: int
    count: int
    seed: int
    seconds: float | None
    reference: bytes | None
    memo: TaskMemo = field(default_factory=LocalMemo, compare=False, repr=False)
    # The generation's id (a vendor that takes our own id for its task gets it).
    job: str = ""
    # A comfyui model's workflow (API format) and its field -> "node.input" map.
    workflow: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    inputs: Mapping[str, str] = field(default_factory=dict, compare=False)


@dataclass(frozen=True, slots=True)
class Output:
    """One generated file: its bytes and the extension of its type."""

    data: bytes
    extension: Literal["png", "jpg", "webp", "mp4"]


class UpstreamError(Exception):
    """An upstream failed; `code` is the public error, `transient` says retry."""

    def __init__(
        self, code: str, *, transient: bool, retry_after: float | None = None
    ) -> None:
        super().__init__(code)
        self.code = code
        self.transient = transient
        self.retry_after = retry_after


class Upstream(Protocol):
    """Runs generations for the models routed to it."""

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Produce the outputs, reporting progress in [0, 1]; raise UpstreamError."""

    async def aclose(self) -> None:
        """Release connections."""
