"""How a media store fails, apart from any store, so callers need no bucket client."""

from __future__ import annotations


class MediaUnavailable(OSError):
    """The bucket could not be reached, or refused the request.

    An OSError, like a store that is down: /api answers 503 UNAVAILABLE and a
    worker leaves the job unacknowledged, to run again when its lease lapses.
    """


class MediaRefused(MediaUnavailable):
    """The bucket refused our credentials: the settings are wrong, not the network."""


class RangeNotSatisfiable(Exception):
    """The asked-for range starts past the object's end (HTTP 416)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"the object has {size} bytes")
        self.size = size
