"""Bytes on a socket: requests no HTTP client would send, or would not cut short."""

from __future__ import annotations

import asyncio

from yarl import URL


async def exchange(base_url: str | URL, request: bytes) -> bytes:
    """Send raw request bytes; return everything the server answers until it closes."""
    url = URL(base_url)
    reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(request)
    answer = await reader.read()
    writer.close()
    await writer.wait_closed()
    return answer


async def abandon(base_url: str | URL, request: bytes) -> None:
    """Send the start of a request, let the server begin reading it, then hang up."""
    url = URL(base_url)
    _reader, writer = await asyncio.open_connection(url.host, url.port)
    writer.write(request)
    await writer.drain()
    await asyncio.sleep(0.1)  # the handler is reading the body
    writer.close()
    await writer.wait_closed()
