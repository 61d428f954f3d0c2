"""Reference uploads: only real, whole, reasonably sized PNG, JPEG or WebP pass."""

from __future__ import annotations

import io
import random
import struct
import zlib

import pytest
from PIL import Image

from service.studio.media.images import ImageInfo, InvalidImage, inspect_image


def _encode(image: Image.Image, format: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format, **options)
    return buffer.getvalue()


def _noise(width: int, height: int) -> Image.Image:
    """Incompressible pixels, so the encoded file is long enough to cut."""
    rng = random.Random(1)
    return Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))


def _chunk(kind: bytes, body: bytes) -> bytes:
    return (
        struct.pack(">I", len(body))
        + kind
        + body
        + struct.pack(">I", zlib.crc32(kind + body))
    )


def _png_claiming(width: int, height: int) -> bytes:
    """A valid-looking PNG header for a huge 1-bit image, with one tiny IDAT."""
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)  # 1-bit grey
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(b"\x00" * 1024))
        + _chunk(b"IEND", b"")
    )


@pytest.mark.parametrize(
    ("format", "content_type", "extension"),
    [
        ("PNG", "image/png", "png"),
        ("JPEG", "image/jpeg", "jpg"),
        ("WEBP", "image/webp", "webp"),
    ],
)
def test_real_png_jpeg_and_webp_are_accepted(
    format: str, content_type: str, extension: str
) -> None:
    """The detected format, not a filename, gives the type and extension."""
    data = _encode(_noise(64, 48), format)
    assert inspect_image(data) == ImageInfo(content_type, extension, 64, 48)


def test_a_png_with_transparency_is_accepted() -> None:
    """Alpha and palette modes are ordinary PNGs."""
    image = Image.new("RGBA", (10, 20), (1, 2, 3, 0))
    assert inspect_image(_encode(image, "PNG")).extension == "png"
    assert inspect_image(_encode(image.convert("P"), "PNG")).height == 20


def test_an_image_at_exactly_max_side_is_accepted() -> None:
    """The limit is inclusive."""
    data = _encode(Image.new("L", (300, 1)), "PNG")
    assert inspect_image(data, max_side=300).width == 300


@pytest.mark.parametrize(
    "data",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"hello", id="text renamed to png"),
        pytest.param(
            b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>',
            id="svg",
        ),
        pytest.param(b"\x89PNG\r\n\x1a\n", id="png signature only"),
    ],
)
def test_things_that_are_not_images_are_refused(data: bytes) -> None:
    """Text, markup and bare signatures never reach the store."""
    with pytest.raises(InvalidImage):
        inspect_image(data)


def test_a_gif_is_refused() -> None:
    """GIF is a real image but not one of the accepted formats."""
    with pytest.raises(InvalidImage):
        inspect_image(_encode(Image.new("RGB", (8, 8), (9, 9, 9)), "GIF"))


@pytest.mark.parametrize("format", ["PNG", "JPEG", "WEBP"])
def test_a_file_cut_in_half_is_refused(format: str) -> None:
    """A truncated upload has a valid header but cannot be decoded whole."""
    data = _encode(_noise(64, 64), format)
    with pytest.raises(InvalidImage):
        inspect_image(data[: len(data) // 2])


def test_a_header_claiming_100000_squared_is_refused() -> None:
    """A few hundred bytes that would need 10¹⁰ pixels are a decompression bomb."""
    with pytest.raises(InvalidImage):
        inspect_image(_png_claiming(100_000, 100_000))


@pytest.mark.parametrize("side", [10_000, 20_000])
def test_a_bomb_is_refused_even_under_a_generous_max_side(side: int) -> None:
    """Pillow's own pixel limit (warning at 89 Mpx, error at twice that) refuses."""
    with pytest.raises(InvalidImage, match="pixels"):
        inspect_image(_png_claiming(side, side), max_side=side)


def test_a_real_compressed_bomb_is_refused_before_decoding() -> None:
    """A 1-bit 10000² PNG compresses to a few KB; its header alone refuses it."""
    data = _encode(Image.new("1", (10_000, 10_000)), "PNG")
    assert len(data) < 100_000
    with pytest.raises(InvalidImage):
        inspect_image(data)


def test_a_1_by_50000_image_is_refused() -> None:
    """Either side over max_side is too large, whatever the pixel count."""
    with pytest.raises(InvalidImage, match="4096"):
        inspect_image(_encode(Image.new("L", (1, 50_000)), "PNG"))


def test_a_header_claiming_zero_pixels_is_refused() -> None:
    """An image with no pixels is not a reference."""
    with pytest.raises(InvalidImage):
        inspect_image(_png_claiming(0, 10))


def test_an_animated_webp_is_refused() -> None:
    """A reference is one picture; animations are turned away."""
    frames = [Image.new("RGB", (16, 16), (i * 60, 0, 0)) for i in range(3)]
    data = _encode(frames[0], "WEBP", save_all=True, append_images=frames[1:])
    with pytest.raises(InvalidImage, match="animated"):
        inspect_image(data)
