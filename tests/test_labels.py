"""AI labels on every file a generation makes: measured, read back independently."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import av
import pytest
from fontTools.ttLib import TTFont
from hypothesis import given, settings, strategies as st
from PIL import Image, PngImagePlugin

from service.labels.explicit import FONT_PATH, MIN_CAP_SHARE, TEXT, stamp_for
from service.labels.finish import label_master, read_labels
from service.labels.implicit import LabelError, make_label, verifies, xmp_packet
from service.settings import LabelsSettings
from service.studio.media.demo_art import (
    picture_thumbnail,
    render_image,
    render_video,
    thumbnail_webp,
)
from service.studio.media.finishing import finish

from .labels_support import assert_one_label, clip_with_audio, exiftool, tc260_labels

SECRET = "label-test-secret-0123456789abcdef-0123"
SETTINGS = LabelsSettings(
    producer_code="001191110102MACQD9K64010000",
    propagator_code="001191110102MACQD9K64020000",
    secret_key=SECRET,
)


def _picture(width: int, height: int, colour: tuple[int, int, int]) -> Image.Image:
    return Image.new("RGB", (width, height), colour)


def _encoded(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def _cap_height_from_the_font(font_size: int) -> float:
    """Read sCapHeight and unitsPerEm with fontTools, not with our own parser."""
    font = TTFont(FONT_PATH)
    return float(font_size * font["OS/2"].sCapHeight / font["head"].unitsPerEm)


@pytest.mark.parametrize(
    ("width", "height"), [(512, 512), (1024, 1024), (1536, 1024), (720, 1280)]
)
@pytest.mark.parametrize("colour", [(0, 0, 0), (255, 255, 255)])
def test_the_visible_label_is_big_enough_and_drawn_in_the_corner(
    width: int, height: int, colour: tuple[int, int, int]
) -> None:
    """Cap height ≥ 5 % of the shortest side by the font's metrics; the corner changed;
    the white letters' ink is as tall as the metrics say."""
    plain = _picture(width, height, colour)
    labeled = finish(SETTINGS, _encoded(plain, "PNG"), "png", "w1")
    with Image.open(io.BytesIO(labeled.data)) as opened:
        image = opened.convert("RGB")
    stamp = stamp_for(width, height)
    short = min(width, height)
    cap = _cap_height_from_the_font(stamp.font_size)
    assert cap >= MIN_CAP_SHARE * short
    assert cap == pytest.approx(0.06 * short, abs=1.5)
    left, top, right, bottom = stamp.box
    assert right <= width
    assert bottom <= height
    assert left > width / 2  # bottom-right
    assert top > height / 2
    corner = image.crop(stamp.box)
    changed = sum(1 for p in corner.get_flattened_data() if p != colour)
    assert changed > 0.5 * corner.width * corner.height
    # The letters "AI" are white; their ink spans the cap height. Inside the
    # plate's rounded corners, where the background no longer shows.
    inset = math.ceil(0.3 * cap) + 1
    corner = corner.crop((inset, inset, corner.width - inset, corner.height - inset))
    font = TTFont(FONT_PATH)
    glyphs = font.getBestCmap()
    advance = sum(font["hmtx"][glyphs[ord(c)]][0] for c in "AI")
    ai_width = advance * stamp.font_size / font["head"].unitsPerEm
    ink = [
        (x, y)
        for y in range(corner.height)
        for x in range(corner.width)
        if min(corner.getpixel((x, y))) > 200  # type: ignore[arg-type]
    ]
    first = min(x for x, _ in ink)
    rows = {y for x, y in ink if x < first + ai_width * 0.9}
    assert max(rows) - min(rows) + 1 >= MIN_CAP_SHARE * short


def test_every_picture_format_carries_exactly_one_verifying_label() -> None:
    """PNG, JPEG and WebP from an upstream, and each one's WebP thumbnail."""
    image = Image.open(io.BytesIO(render_image("a lamp", 3, 640, 480)))
    for fmt, extension in (("PNG", "png"), ("JPEG", "jpg"), ("WEBP", "webp")):
        finished = finish(SETTINGS, _encoded(image, fmt), extension, f"w-{extension}")
        label = assert_one_label(finished.data, extension, SECRET, f"w-{extension}")
        assert label["ContentProducer"] == SETTINGS.producer_code
        assert label["ContentPropagator"] == SETTINGS.propagator_code
        assert_one_label(finished.thumb, "webp", SECRET, f"w-{extension}")
        with Image.open(io.BytesIO(finished.data)) as back:
            assert back.size == (640, 480)
            assert back.format == fmt


def test_a_thumbnail_from_the_labeled_pixels_is_the_one_the_stored_png_gives() -> None:
    """The master is not decoded again, and its thumbnail does not change for it."""
    master = label_master(SETTINGS, render_image("a lamp", 4, 1024, 768), "png", "w1")
    assert master.picture is not None
    packet = master.derivative_packet
    assert picture_thumbnail(master.picture, xmp=packet) == thumbnail_webp(
        master.data, xmp=packet
    )


def test_the_png_keeps_its_label_before_the_pixels() -> None:
    """The iTXt XMP sits before IDAT: in the file's head, as the Measures say."""
    finished = finish(SETTINGS, render_image("x", 1, 64, 64), "png", "w")
    chunks = []
    at = 8
    while at < len(finished.data):
        length = int.from_bytes(finished.data[at : at + 4], "big")
        chunks.append(finished.data[at + 4 : at + 8])
        at += 12 + length
    assert chunks.index(b"iTXt") < chunks.index(b"IDAT")
    assert chunks.count(b"iTXt") == 1


def test_the_webp_sets_the_vp8x_xmp_flag() -> None:
    """A WebP with an XMP chunk says so in VP8X (bit 2 of its flags)."""
    finished = finish(SETTINGS, render_image("x", 1, 300, 200), "png", "w")
    assert finished.thumb[12:16] == b"VP8X"
    assert finished.thumb[20] & 0x04
    assert finished.thumb.count(b"XMP ") == 1


def test_an_upstreams_own_label_is_replaced_by_ours() -> None:
    """A file that arrives with a TC260 label (XMP and a raw AIGC text chunk)
    leaves with exactly one: ours."""
    theirs = {
        "Label": "1",
        "ContentProducer": "001191440300708461136T1XGW3",
        "ProduceID": "vendor-1",
        "ReservedCode1": "ab",
        "ContentPropagator": "",
        "PropagateID": "",
        "ReservedCode2": "",
    }
    image = _picture(320, 240, (10, 120, 200))
    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", xmp_packet(theirs, None).decode())
    info.add_text("AIGC", json.dumps({"AIGC": theirs}))
    png = _encoded(image, "PNG", pnginfo=info)
    assert len(tc260_labels(exiftool(png, "png"))) == 1  # theirs, as they sent it
    jpeg = _encoded(image, "JPEG", xmp=xmp_packet(theirs, None))
    for data, extension in ((png, "png"), (jpeg, "jpg")):
        finished = finish(SETTINGS, data, extension, "ours")
        label = assert_one_label(finished.data, extension, SECRET, "ours")
        assert label["ContentProducer"] == SETTINGS.producer_code
        tags = exiftool(finished.data, extension)
        assert not [name for name, _ in tags if name.endswith(":AIGC")]


def _frames(data: bytes) -> list[Image.Image]:
    with av.open(io.BytesIO(data), mode="r") as container:
        return [f.to_image() for f in container.decode(video=0)]  # type: ignore[no-untyped-call]


def _bright(image: Image.Image) -> int:
    """Count the near-white pixels (the label's letters)."""
    grey = image.convert("L").get_flattened_data()
    return len([p for p in grey if isinstance(p, int) and p > 200])


def _packets(data: bytes) -> int:
    with av.open(io.BytesIO(data), mode="r") as container:
        return sum(1 for p in container.demux(audio=0) if p.size)


def test_a_video_is_labeled_on_every_frame_and_keeps_its_audio(tmp_path: Path) -> None:
    """First, middle and last frames show the plate; the AAC track survives; the
    upstream's AIGC key is replaced; the poster carries the label too."""
    source = clip_with_audio(tmp_path / "upstream.mp4")
    finished = finish(SETTINGS, source, "mp4", "clip-1")
    assert finished.video is not None
    width, height, duration = finished.video
    assert (width, height) == (320, 240)
    assert duration == pytest.approx(2.0, abs=0.1)
    assert_one_label(finished.data, "mp4", SECRET, "clip-1")
    assert_one_label(finished.thumb, "webp", SECRET, "clip-1")
    with av.open(io.BytesIO(finished.data), mode="r") as container:
        (audio,) = container.streams.audio
        assert audio.codec_context.name == "aac"
        assert audio.sample_rate == 44100
    assert _packets(finished.data) == _packets(source) > 0
    before, after = _frames(source), _frames(finished.data)
    assert len(before) == len(after) == 48
    box = stamp_for(width, height).box
    for index in (0, len(after) // 2, len(after) - 1):
        old, new = before[index].crop(box), after[index].crop(box)
        assert _bright(new) > 0.05 * new.width * new.height  # the white letters
        assert _bright(old) == 0


def test_a_demo_clip_at_720p_is_labeled_throughout() -> None:
    """The demo's own clip: labeled frames, one label, no audio needed."""
    clip = render_video("waves", 2, 720, 1280, 1.0, fps=12)
    finished = finish(SETTINGS, clip, "mp4", "clip-2")
    assert_one_label(finished.data, "mp4", SECRET, "clip-2")
    frames = _frames(finished.data)
    box = stamp_for(720, 1280).box
    for frame in (frames[0], frames[len(frames) // 2], frames[-1]):
        assert _bright(frame.crop(box)) > 100


def test_the_frames_sampled_for_the_output_check_carry_the_clips_label() -> None:
    """A provider fetches them by URL: files like the poster, labeled like it."""
    clip = render_video("waves", 3, 320, 240, 2.5, fps=8)
    finished = finish(SETTINGS, clip, "mp4", "clip-3", frames=True)
    assert len(finished.frames) == 2  # at 1 s and 2 s
    for frame in finished.frames:
        assert_one_label(frame, "webp", SECRET, "clip-3")


def test_labels_made_before_a_key_rotation_still_verify() -> None:
    """STUDIO_SECRET_KEY_PREVIOUS keeps old labels verifying; a stranger's key not."""
    label = make_label(SETTINGS, "old-work")
    rotated = dataclasses.replace(
        SETTINGS, secret_key="n" * 40, secret_key_previous=SECRET
    )
    assert verifies(label, rotated)
    assert not verifies(label, dataclasses.replace(rotated, secret_key_previous=""))
    assert not verifies({**label, "ProduceID": "other"}, rotated)


def test_an_edited_label_does_not_verify_though_its_code_is_intact() -> None:
    """The code covers producer and id only; the rest must keep the standard's form."""
    label = make_label(SETTINGS, "w")
    assert verifies(label, SETTINGS)
    edits: list[dict[str, object]] = [
        {**label, "Label": "3"},
        {**label, "Extra": "x"},
        {key: value for key, value in label.items() if key != "ReservedCode2"},
        {**label, "ReservedCode2": "has space"},
        {**label, "PropagateID": "é"},
        {**label, "ContentPropagator": 7},
    ]
    for edited in edits:
        assert not verifies(edited, SETTINGS), edited


def test_a_file_that_is_not_a_picture_or_clip_is_refused() -> None:
    """Bytes no decoder reads raise LabelError: nothing unlabeled is stored."""
    with pytest.raises(LabelError):
        label_master(SETTINGS, b"not an image", "png", "w")
    with pytest.raises(LabelError):
        label_master(SETTINGS, b"\x00\x00\x00\x18ftypmp42 junk", "mp4", "w")


def test_our_reader_agrees_with_exiftool() -> None:
    """read_labels finds the same single label ExifTool does."""
    finished = finish(SETTINGS, render_image("x", 1, 200, 100), "png", "agree")
    findings = read_labels(finished.data, "png")
    assert findings.parsed() == tc260_labels(exiftool(finished.data, "png"))[0]
    assert TEXT in findings.explicit[0]


def test_a_turned_photo_is_labeled_upright_and_transparency_is_kept() -> None:
    """EXIF orientation is applied before the corner is chosen (EXIF is not kept);
    a palette PNG with transparency stays transparent outside the plate."""
    exif = Image.Exif()
    exif[0x0112] = 6  # shown turned 90° clockwise: 200×100 stored, 100×200 seen
    turned = _encoded(_picture(200, 100, (30, 30, 30)), "JPEG", exif=exif.tobytes())
    finished = finish(SETTINGS, turned, "jpg", "turned")
    with Image.open(io.BytesIO(finished.data)) as image:
        assert image.size == (100, 200)
        assert not image.getexif()
        left, top, _, _ = stamp_for(100, 200).box
        assert left > 50
        assert top > 100
    clear = Image.new("P", (120, 80), 0)
    clear.putpalette([0, 0, 0, 255, 255, 255])
    png = _encoded(clear, "PNG", transparency=0)
    finished = finish(SETTINGS, png, "png", "clear")
    with Image.open(io.BytesIO(finished.data)) as image:
        assert image.mode == "RGBA"
        assert image.getpixel((0, 0)) == (0, 0, 0, 0)
        box = stamp_for(120, 80).box
        assert image.getpixel((box[0] + 3, box[1] + 3))[3] > 0  # type: ignore[index]
    assert_one_label(finished.data, "png", SECRET, "clear")


_HEADS = {
    "png": b"\x89PNG\r\n\x1a\n",
    "jpg": b"\xff\xd8\xff",
    "webp": b"RIFF\x00\x00\x00\x00WEBP",
    "mp4": b"\x00\x00\x00\x10ftypisom",
}


def _box(kind: bytes, payload: bytes) -> bytes:
    return (8 + len(payload)).to_bytes(4, "big") + kind + payload


_PARTS = st.one_of(
    st.binary(max_size=48),
    st.builds(
        lambda kind, payload: _box(kind, payload),
        st.sampled_from([b"moov", b"meta", b"keys", b"ilst", b"uuid", b"hdlr"]),
        st.binary(max_size=24),
    ),
    st.builds(  # a PNG iTXt chunk that claims compressed XMP
        lambda payload: len(payload).to_bytes(4, "big") + b"iTXt" + payload + b"\0" * 4,
        st.binary(max_size=32).map(
            lambda b: b"XML:com.adobe.xmp\x00\x01\x00\x00\x00" + b
        ),
    ),
    st.just(_box(b"moov", _box(b"meta", _box(b"hdlr", b"") + _box(b"keys", b"")))),
)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(sorted(_HEADS)), st.lists(_PARTS, max_size=5))
def test_reading_hostile_bytes_never_raises(extension: str, parts: list[bytes]) -> None:
    """Whatever a file's boxes, chunks and segments say, reading finds no label
    or some, and never crashes (`labels check` reads any file it is given)."""
    findings = read_labels(_HEADS[extension] + b"".join(parts), extension)
    assert isinstance(findings.labels, list)
