"""The event loop every command runs on."""

from __future__ import annotations

import asyncio


def new_loop() -> asyncio.AbstractEventLoop:
    """Use uvloop where it is installed: it serves more requests per core."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
