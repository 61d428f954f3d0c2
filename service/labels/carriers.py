"""Where each file format keeps its XMP and its TC260 label, read and written.

PNG: iTXt `XML:com.adobe.xmp` before IDAT; JPEG: APP1 `http://ns.adobe.com/xap/1.0/`;
WebP: the `XMP ` chunk with VP8X's flag (Pillow writes all three). MP4: the
`AIGC` key in moov/udta/meta (mdta keys + ilst, PyAV with movflags=use_metadata_tags)
and an XMP `uuid` box for the rest. The readers walk the containers themselves,
so they count every copy: a file must carry exactly one label.
"""

from __future__ import annotations

import io
import struct
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:  # Pillow only where a picture is encoded: sniff() stays light
    from PIL import Image

PNG_SIGNATURE: Final = b"\x89PNG\r\n\x1a\n"
XMP_KEYWORD: Final = b"XML:com.adobe.xmp"
JPEG_XMP: Final = b"http://ns.adobe.com/xap/1.0/\x00"
# ISO BMFF `uuid` box of an XMP packet (XMP Specification Part 3, 1.2.7).
MP4_XMP_UUID: Final = bytes.fromhex("be7acfcb97a942e89c71999491e3afac")
AIGC_KEY: Final = "AIGC"
# A compressed XMP packet is inflated to at most this much (no zip bombs).
MAX_XMP: Final = 4 * 1024 * 1024
# zlib level of a labeled PNG, ComfyUI's own SaveImage level. Pillow's default,
# 6, took 2.2-2.3x as long on photograph-like 1024² pictures (450 ms against
# 200, bench/labels.py) for 1.5 % fewer bytes at most; only flat drawings, small
# anyway, grow (47 KB to 61 KB for the demo's).
PNG_LEVEL: Final = 4


def encode_image(image: Image.Image, extension: str, packet: bytes) -> bytes:
    """Encode a picture with one XMP packet and no other metadata but its ICC."""
    buffer = io.BytesIO()
    icc = image.info.get("icc_profile")
    extra = {"icc_profile": icc} if icc else {}
    if extension == "png":
        from PIL import PngImagePlugin

        info = PngImagePlugin.PngInfo()
        info.add_itxt(XMP_KEYWORD.decode(), packet.decode())
        image.save(
            buffer, format="PNG", pnginfo=info, compress_level=PNG_LEVEL, **extra
        )
    elif extension == "jpg":
        if image.mode not in ("RGB", "L"):
            image = image.convert("RGB")
        image.save(buffer, format="JPEG", quality=93, xmp=packet, **extra)
    elif extension == "webp":
        image.save(buffer, format="WEBP", quality=90, xmp=packet, **extra)
    else:
        raise ValueError(f"not a picture format: {extension}")
    return buffer.getvalue()


def png_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield (type, payload) of each PNG chunk."""
    if not data.startswith(PNG_SIGNATURE):
        return
    at = len(PNG_SIGNATURE)
    while at + 8 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, at)
        yield kind, data[at + 8 : at + 8 + length]
        at += 12 + length


def _png_xmp(data: bytes) -> list[bytes]:
    packets = []
    for kind, payload in png_chunks(data):
        if kind != b"iTXt":
            continue
        keyword, _, rest = payload.partition(b"\x00")
        if keyword != XMP_KEYWORD or len(rest) < 2:
            continue
        compressed, text = rest[0], rest[2:]
        _, _, text = text.partition(b"\x00")  # language tag
        _, _, text = text.partition(b"\x00")  # translated keyword
        if compressed:
            try:
                text = zlib.decompressobj().decompress(text, MAX_XMP)
            except zlib.error:
                continue
        packets.append(text)
    return packets


def _jpeg_xmp(data: bytes) -> list[bytes]:
    packets: list[bytes] = []
    if not data.startswith(b"\xff\xd8"):
        return packets
    at = 2
    while at + 4 <= len(data) and data[at] == 0xFF:
        marker = data[at + 1]
        if marker == 0xDA or marker == 0xD9:  # start of scan / end: no more headers
            break
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:
            at += 2
            continue
        (length,) = struct.unpack_from(">H", data, at + 2)
        payload = data[at + 4 : at + 2 + length]
        if marker == 0xE1 and payload.startswith(JPEG_XMP):
            packets.append(payload[len(JPEG_XMP) :])
        at += 2 + length
    return packets


def riff_chunks(data: bytes) -> Iterator[tuple[bytes, bytes]]:
    """Yield (fourcc, payload) of each chunk of a RIFF WEBP file."""
    if data[:4] != b"RIFF" or data[8:12] != b"WEBP":
        return
    at = 12
    while at + 8 <= len(data):
        kind, length = struct.unpack_from("<4sI", data, at)
        yield kind, data[at + 8 : at + 8 + length]
        at += 8 + length + (length & 1)


def _webp_xmp(data: bytes) -> list[bytes]:
    return [payload for kind, payload in riff_chunks(data) if kind == b"XMP "]


def boxes(
    data: bytes, start: int = 0, end: int | None = None
) -> Iterator[tuple[bytes, int, int]]:
    """Yield (type, payload start, payload end) of the ISO BMFF boxes in a range."""
    end = len(data) if end is None else end
    at = start
    while at + 8 <= end:
        size, kind = struct.unpack_from(">I4s", data, at)
        header = 8
        if size == 1:
            (size,) = struct.unpack_from(">Q", data, at + 8)
            header = 16
        elif size == 0:
            size = end - at
        if size < header or at + size > end:
            return
        yield kind, at + header, at + size
        at += size


def _mp4_xmp(data: bytes) -> list[bytes]:
    return [
        data[start + 16 : stop]
        for kind, start, stop in boxes(data)
        if kind == b"uuid" and data[start : start + 16] == MP4_XMP_UUID
    ]


def xmp_box(packet: bytes) -> bytes:
    """Wrap an XMP packet as a top-level MP4 `uuid` box (appended: no offset moves)."""
    return struct.pack(">I4s", 8 + 16 + len(packet), b"uuid") + MP4_XMP_UUID + packet


def mp4_aigc(data: bytes) -> list[str]:
    """Every `AIGC` value in moov/meta and moov/udta/meta (keys + ilst)."""
    values = []
    for kind, start, stop in boxes(data):
        if kind != b"moov":
            continue
        metas = [(s, e) for k, s, e in boxes(data, start, stop) if k == b"meta"]
        for k, s, e in boxes(data, start, stop):
            if k == b"udta":
                metas += [(s2, e2) for k2, s2, e2 in boxes(data, s, e) if k2 == b"meta"]
        for meta_start, meta_end in metas:
            try:
                values += _meta_values(data, meta_start, meta_end)
            except struct.error:  # a box cut short: it holds no label
                continue
    return values


def _meta_values(data: bytes, start: int, end: int) -> list[str]:
    """The `AIGC` items of one meta box (a full box in MP4, plain in QuickTime)."""
    if data[start + 4 : start + 8] != b"hdlr":
        start += 4  # version and flags
    children = {kind: (s, e) for kind, s, e in boxes(data, start, end)}
    if b"keys" not in children or b"ilst" not in children:
        return []
    keys_start, keys_end = children[b"keys"]
    (count,) = struct.unpack_from(">I", data, keys_start + 4)
    names, at = {}, keys_start + 8
    for index in range(1, count + 1):
        if at + 8 > keys_end:
            break
        (size,) = struct.unpack_from(">I", data, at)
        names[index] = data[at + 8 : at + size].decode("utf-8", "replace")
        at += size
    values = []
    for kind, item_start, item_end in boxes(data, *children[b"ilst"]):
        (index,) = struct.unpack(">I", kind)
        if names.get(index) != AIGC_KEY:
            continue
        for sub, s, e in boxes(data, item_start, item_end):
            if sub == b"data":
                values.append(data[s + 8 : e].decode("utf-8", "replace"))
    return values


def xmp_packets(data: bytes, extension: str) -> list[bytes]:
    """Every XMP packet a file carries, in the place its format keeps them."""
    readers = {"png": _png_xmp, "jpg": _jpeg_xmp, "webp": _webp_xmp, "mp4": _mp4_xmp}
    return readers[extension](data)


def sniff(data: bytes) -> Literal["png", "jpg", "webp", "mp4"] | None:
    """Name a file's type by its first bytes (None: not one we make or keep)."""
    if data.startswith(PNG_SIGNATURE):
        return "png"
    if data.startswith(b"\xff\xd8\xff"):
        return "jpg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    if data[4:8] == b"ftyp":
        return "mp4"
    return None
