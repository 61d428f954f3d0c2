"""Hand the C heap's freed pages back to the system after a large job.

Encoders, decoders and Pillow take frames of megabytes from glibc's malloc,
which keeps what they free in its per-thread arenas: a worker that encoded
one clip would hold that memory for good (and `serve` what rendering its
documents took at start-up). malloc_trim(0) returns it. Only glibc has it;
elsewhere (musl) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import ParamSpec, TypeVar

_P = ParamSpec("_P")
_T = TypeVar("_T")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        trim: Callable[[int], int] = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


def release_freed_memory() -> None:
    """Return the free pages of every malloc arena to the system."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def releasing(function: Callable[_P, _T]) -> Callable[_P, _T]:
    """Wrap a media step so that what it freed goes back once it returns."""

    @functools.wraps(function)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _T:
        try:
            return function(*args, **kwargs)
        finally:
            release_freed_memory()

    return wrapper
