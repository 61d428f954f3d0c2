"""A stream never shows a generation going back, whatever order events arrive in."""

from __future__ import annotations

from service.studio.events import Furthest


def _view(gid: str, status: str, progress: float) -> dict[str, object]:
    return {"id": gid, "status": status, "progress": progress}


def test_an_event_older_than_what_the_stream_showed_is_not_sent_again() -> None:
    """Running after the snapshot, then a stale queued or a lower progress: dropped.

    The same state again (a new place in line) and anything further go out.
    """
    furthest = Furthest()
    assert furthest.newer(_view("g1", "running", 0.3))  # the opening snapshot
    assert not furthest.newer(_view("g1", "queued", 0.0))  # published before it
    assert not furthest.newer(_view("g1", "running", 0.2))
    assert furthest.newer(_view("g1", "running", 0.3))  # the same, told again
    assert furthest.newer(_view("g1", "running", 0.5))
    assert furthest.newer(_view("g1", "succeeded", 1.0))
    assert not furthest.newer(_view("g1", "running", 0.9))
    assert furthest.newer(_view("g2", "queued", 0.0))  # each generation its own
    assert furthest.newer(_view("g2", "canceled", 0.0))  # an end, at any progress
    assert furthest.newer({"event": "no id"})
