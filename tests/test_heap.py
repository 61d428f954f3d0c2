"""Freed C heap goes back to the system after a large job, and nothing else changes."""

from __future__ import annotations

import platform

import pytest

from service.heap import release_freed_memory, releasing


def _resident_kb() -> int:
    with open("/proc/self/status") as status:
        return int(status.read().split("VmRSS:")[1].split()[0])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_pages_freed_inside_the_heap_go_back_to_the_system() -> None:
    """Blocks below the mmap threshold stay resident once freed, until trimmed."""
    keep = []
    blocks = [bytearray(64 * 1024) for _ in range(3000)]  # ~190 MiB from the heap
    for index, block in enumerate(blocks):
        block[::4096] = b"x" * len(block[::4096])  # touch every page
        if index % 100 == 99:
            keep.append(block)  # pins the heap's top, so free() cannot shrink it
    del blocks, block
    before = _resident_kb()
    release_freed_memory()
    assert before - _resident_kb() > 100 * 1024
    assert len(keep) == 30


def test_a_releasing_step_returns_and_raises_as_it_did() -> None:
    """The wrapper only adds the release: same value, same exception, same name."""

    @releasing
    def double(value: int) -> int:
        return value * 2

    @releasing
    def refuse() -> None:
        raise ValueError("no")

    assert double(21) == 42
    assert double.__name__ == "double"
    with pytest.raises(ValueError, match="no"):
        refuse()
