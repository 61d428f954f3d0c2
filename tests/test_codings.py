"""Request bodies: gzip and deflate are taken, a broken one is a 400, others a 415."""

from __future__ import annotations

import gzip
import json
import logging
import zlib

import pytest

from service.store.embedded import MailCatcher

from .conftest import Client, MakeClient
from .logs import troubles
from .workbench import sign_in

# Every route that reads a body, signed in or not, JSON or multipart or a notice.
BODIES = (
    ("/api/auth/code", "application/json"),
    ("/api/generations", "application/json"),
    ("/api/orders", "application/json"),
    ("/api/uploads", "multipart/form-data; boundary=x"),
    ("/webhooks/alipay", "application/x-www-form-urlencoded"),
    ("/webhooks/wechatpay", "application/json"),
)


@pytest.fixture
async def client(studio: MakeClient, mail_server: MailCatcher) -> Client:
    """Signed in, with both payment channels (the fake provider) for the webhooks."""
    client = await studio(STUDIO_PAYMENTS_FAKE="1")
    await sign_in(client, mail_server)
    return client


@pytest.mark.parametrize(
    "coding", ["br", "zstd", "compress", "x-gzip", "gzip, gzip", "gzip, br", "🙂"]
)
async def test_a_coding_we_do_not_take_is_a_json_415_on_every_route_with_a_body(
    client: Client, caplog: pytest.LogCaptureFixture, coding: str
) -> None:
    """aiohttp would answer br and zstd in plain text, naming a missing library."""
    caplog.set_level(logging.INFO)
    for path, content_type in BODIES:
        response = await client.post(
            path,
            data=b"\x28\xb5\x2f\xfd whatever",
            headers={
                "Content-Type": content_type,
                "Content-Encoding": coding.encode().decode("latin-1"),
            },
        )
        assert response.status == 415, (path, coding, await response.text())
        assert response.content_type == "application/json", path
        assert await response.json() == {"error": "UNSUPPORTED_ENCODING"}, path
    assert troubles(caplog) == []


@pytest.mark.parametrize(
    "body",
    [
        b"not gzip at all",
        # mtime=0: the header's time is in the test id, and xdist workers must
        # collect the same ids
        gzip.compress(b'{"email":"a@example.com"}', mtime=0)[:-6],  # cut short
        gzip.compress(b'{"email":"a@example.com"}', mtime=0) + b"trailing",
        b"",
    ],
)
@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decompress_is_a_400_without_a_traceback(
    client: Client, caplog: pytest.LogCaptureFixture, coding: str, body: bytes
) -> None:
    """Anonymous callers reach /api/auth/code and the webhooks: nothing to flood."""
    caplog.set_level(logging.INFO)
    for path, content_type in BODIES:
        if path == "/api/uploads":
            continue  # takes no coding at all: a 415 above
        response = await client.post(
            path,
            data=body,
            headers={"Content-Type": content_type, "Content-Encoding": coding},
        )
        assert response.status == 400, (path, await response.text())
        assert await response.json() == {"error": "BAD_REQUEST"}, path
    assert (await client.get("/api/credits")).status == 200  # the connection lived
    assert troubles(caplog) == []


@pytest.mark.parametrize(
    ("coding", "pack"),
    [
        ("gzip", gzip.compress),
        ("deflate", zlib.compress),  # zlib-wrapped, as RFC 9110 says
        ("deflate", lambda data: zlib.compress(data, wbits=-15)),  # as some send it
        ("identity", lambda data: data),
        ("GZip", gzip.compress),
    ],
)
async def test_a_compressed_body_is_read_as_if_sent_plain(
    client: Client, coding: str, pack: object
) -> None:
    """A compressed submit is charged and queued like a plain one."""
    assert callable(pack)
    body = json.dumps({"model": "seedream-4", "prompt": "a cat"}).encode()
    response = await client.post(
        "/api/generations",
        data=pack(body),
        headers={"Content-Type": "application/json", "Content-Encoding": coding},
    )
    assert response.status == 202, await response.text()
    assert (await response.json())["prompt"] == "a cat"


async def test_a_body_that_inflates_past_the_limit_is_a_413(client: Client) -> None:
    """16 KiB is the limit of what a body decompresses to, not of what was sent."""
    bomb = json.dumps({"model": "seedream-4", "prompt": "a" * 10_000_000}).encode()
    response = await client.post(
        "/api/generations",
        data=gzip.compress(bomb),
        headers={"Content-Type": "application/json", "Content-Encoding": "gzip"},
    )
    assert response.status == 413
    assert await response.json() == {"error": "PAYLOAD_TOO_LARGE"}
