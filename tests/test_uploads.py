"""Reference uploads are decoded before they are accepted; refusals keep nothing."""

from __future__ import annotations

import io
import logging
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest
from aiohttp import FormData
from hypothesis import HealthCheck, given, settings, strategies as st
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import MailCatcher

from .conftest import Client, SettingsFactory
from .logs import troubles
from .workbench import sign_in


@pytest.fixture
async def signed_in(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
) -> Client:
    """A signed-in client whose media go to a fresh directory."""
    settings = make_settings(
        STUDIO_MEDIA_DIR=str(tmp_path / "media"), STUDIO_DEMO_UPSTREAM="1"
    )
    client = await aiohttp_client(create_app(settings))
    await sign_in(client, mail_server)
    return client


def _png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 10, 10)).save(buffer, "PNG")
    return buffer.getvalue()


def _form(data: bytes, name: str = "file", filename: str = "a.png") -> FormData:
    form = FormData()
    form.add_field(name, io.BytesIO(data), filename=filename, content_type="image/png")
    return form


def _bomb() -> bytes:
    """A valid PNG header claiming 100000 x 100000 pixels, in a few hundred bytes."""

    def chunk(kind: bytes, payload: bytes) -> bytes:
        crc = zlib.crc32(kind + payload)
        return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", crc)

    header = struct.pack(">IIBBBBB", 100_000, 100_000, 1, 0, 0, 0, 0)
    data = zlib.compress(b"\x00" * 20_000)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", data)
        + chunk(b"IEND", b"")
    )  # fmt: skip


def _media_files(tmp_path: Path) -> list[Path]:
    media = tmp_path / "media"
    return [p for p in media.rglob("*") if p.is_file()] if media.exists() else []


async def test_a_real_png_is_kept_and_served(signed_in: Client, tmp_path: Path) -> None:
    """A decodable image answers 201 with its size and a media URL."""
    response = await signed_in.post("/api/uploads", data=_form(_png(640, 480)))
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    assert (body["width"], body["height"]) == (640, 480)
    media = await signed_in.get(body["media_url"])
    assert media.status == 200
    assert media.headers["Content-Type"] == "image/png"
    assert "RateLimit" in response.headers
    assert len(_media_files(tmp_path)) == 1
    generation = await signed_in.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "like this", "reference": body["id"]},
    )
    assert generation.status == 202
    assert (await generation.json())["reference"] == body["id"]


@pytest.mark.parametrize(
    "data",
    [
        b"hello, I am text",
        b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
        _png(300, 300)[:400],
        _bomb(),
        _png(1, 5000)[:0] + _png(1, 4097),
        b"",
    ],
    ids=["text", "svg", "truncated", "bomb", "too-tall", "empty"],
)
async def test_what_is_not_an_acceptable_image_is_refused_and_not_kept(
    signed_in: Client, tmp_path: Path, data: bytes
) -> None:
    """Renamed text, SVG, truncated PNG, bomb, over 4096 px: 400 INVALID_IMAGE."""
    response = await signed_in.post("/api/uploads", data=_form(data))
    assert response.status == 400
    assert await response.json() == {"error": "INVALID_IMAGE"}
    assert _media_files(tmp_path) == []


async def test_an_upload_over_ten_mebibytes_is_too_large(
    signed_in: Client, tmp_path: Path
) -> None:
    """10 MiB + 1 byte answers 413 TOO_LARGE, whatever the bytes are."""
    response = await signed_in.post(
        "/api/uploads", data=_form(b"\x00" * (10 * 1024 * 1024 + 1))
    )
    assert response.status == 413
    assert await response.json() == {"error": "TOO_LARGE"}
    assert _media_files(tmp_path) == []


async def test_the_wrong_shape_of_request_is_refused(signed_in: Client) -> None:
    """JSON instead of a form is 415; a part not named `file` is 400."""
    response = await signed_in.post("/api/uploads", json={"file": "x"})
    assert response.status == 415
    response = await signed_in.post("/api/uploads", data=_form(_png(8, 8), "image"))
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST", "field": "file"}


# A canary in each malformed header: the log must not quote what the client sent.
CANARY = b"canary-7f3e"
MALFORMED_PART_HEADERS = {
    "a line without a colon": b"Content-Disposition form-data " + CANARY,
    "a NUL in the name": b'Content-Disposition: form-data; name="fi\x00le'
    + CANARY
    + b'"',
    "a control byte in a value": b"X-Note: " + CANARY + b"\x01",
    "a line over 8,190 bytes": b"X-Note: " + CANARY + b"a" * 8_200,
    "a bare CR in a value": b"X-Note: a\rb" + CANARY,
    "a space before the colon": b"X-Note : " + CANARY,
    "a malformed disposition": b"Content-Disposition: form-data; name="
    + CANARY
    + b" x",
}


@pytest.mark.parametrize(
    "header", MALFORMED_PART_HEADERS.values(), ids=list(MALFORMED_PART_HEADERS)
)
async def test_a_malformed_part_header_is_a_400_and_the_log_quotes_none_of_it(
    signed_in: Client, caplog: pytest.LogCaptureFixture, header: bytes
) -> None:
    """aiohttp's multipart parser raises HttpProcessingError: the client's fault."""
    caplog.set_level(logging.DEBUG)
    body = (
        b"--x\r\n" + header + b"\r\n"
        b'Content-Disposition: form-data; name="file"; filename="a.png"\r\n'
        b"Content-Type: image/png\r\n\r\n" + _png(8, 8) + b"\r\n--x--\r\n"
    )
    response = await signed_in.post(
        "/api/uploads",
        data=body,
        headers={"Content-Type": "multipart/form-data; boundary=x"},
    )
    assert response.status == 400
    assert (await response.json())["error"] == "BAD_REQUEST"
    assert troubles(caplog) == []
    assert CANARY.decode() not in caplog.text


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    body=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
        lambda inner: (
            st.lists(inner, max_size=3)
            | st.dictionaries(st.text(max_size=10), inner, max_size=4)
        ),
        max_leaves=8,
    )
    | st.fixed_dictionaries(
        {
            "model": st.sampled_from(["seedream-4", "kling-2-1", "x"]),
            "prompt": st.text(max_size=40),
        },
        optional={
            "count": st.integers(-2, 6),
            "seed": st.integers(-5, 2**33),
            "size": st.sampled_from(["1024x1024", "1280x720", ""]),
            "negative_prompt": st.text(max_size=5),
        },
    ),
    raw=st.binary(max_size=300),
)
async def test_random_bodies_never_get_a_server_error(
    signed_in: Client, body: object, raw: bytes
) -> None:
    """Whatever JSON or bytes arrive, the answer is a client error or a success."""
    response = await signed_in.post(
        "/api/generations", json=body, headers={"Idempotency-Key": "k"}
    )
    assert response.status < 500, await response.text()
    response = await signed_in.post("/api/uploads", data=_form(raw))
    assert response.status < 500
    response = await signed_in.post(
        "/api/uploads", data=raw, headers={"Content-Type": "multipart/form-data"}
    )
    assert response.status < 500
