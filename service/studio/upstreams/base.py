"""The one interface every model upstream speaks, whatever its protocol.

A real protocol maps onto `generate` like this: submit the request, then poll
(or wait on) the vendor's job, calling `progress` as it moves; fetch the
result; and when the task is cancelled (the person canceled, the deadline
passed, the worker is shutting down) tell the vendor to cancel before letting
the CancelledError go on. Failures are UpstreamError: transient ones are
retried by the worker with backoff within the job's deadline, refusals fail
the generation at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal, Protocol

Progress = Callable[[float], Awaitable[None]]


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
