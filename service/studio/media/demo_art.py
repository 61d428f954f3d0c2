"""Pictures and clips for the offline demo model: real files, no network, no GPU.

Everything here is synchronous and CPU-bound; callers run it in an executor.
The art is a seeded gradient with translucent shapes and the prompt as a
caption, so the same (prompt, seed, size) always gives the same bytes.
"""

from __future__ import annotations

import io
import math
import random
import tempfile
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Final, Literal

import av
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter
from PIL import Image, ImageDraw, ImageFont, ImageOps

from ...heap import releasing

CAPTION_CHARS: Final = 60
PROGRESS_CALLS: Final = 20
_RGB = tuple[int, int, int]
_RGBA = tuple[int, int, int, int]


def _seeded(prompt: str, seed: int) -> random.Random:
    """Derive the generator from both inputs, so either one changes the art."""
    return random.Random(f"{seed}:{prompt}")


def _colour(rng: random.Random, low: int = 0, high: int = 255) -> _RGB:
    """Draw one colour within a brightness band."""
    return (rng.randint(low, high), rng.randint(low, high), rng.randint(low, high))


def _background(rng: random.Random, width: int, height: int) -> Image.Image:
    """Blend two seeded colours along a seeded diagonal (a 256² mask, resized)."""
    start, end = _colour(rng, 20, 200), _colour(rng, 40, 255)
    ramp = Image.linear_gradient("L")  # 0 at the top, 255 at the bottom
    across = ramp.transpose(Image.Transpose.ROTATE_90)
    if rng.random() < 0.5:
        ramp = ramp.transpose(Image.Transpose.FLIP_TOP_BOTTOM)
    mask = Image.blend(ramp, across, rng.uniform(0.0, 1.0))
    mask = mask.resize((width, height), Image.Resampling.BILINEAR)
    return Image.composite(
        Image.new("RGB", (width, height), end),
        Image.new("RGB", (width, height), start),
        mask,
    )


def _shapes(rng: random.Random, image: Image.Image) -> None:
    """Scatter translucent ellipses, rectangles and triangles over the image."""
    width, height = image.size
    draw = ImageDraw.Draw(image, "RGBA")
    for _ in range(rng.randint(5, 9)):
        fill: _RGBA = (*_colour(rng), rng.randint(60, 170))
        x, y = rng.uniform(0, width), rng.uniform(0, height)
        rx = rng.uniform(0.05, 0.3) * width
        ry = rng.uniform(0.05, 0.3) * height
        kind = rng.randrange(3)
        if kind == 0:
            draw.ellipse((x - rx, y - ry, x + rx, y + ry), fill=fill)
        elif kind == 1:
            draw.rectangle((x - rx, y - ry, x + rx, y + ry), fill=fill)
        else:
            turn = rng.uniform(0, 2 * math.pi)
            points = [
                (
                    x + rx * math.cos(turn + k * 2 * math.pi / 3),
                    y + ry * math.sin(turn + k * 2 * math.pi / 3),
                )
                for k in range(3)
            ]
            draw.polygon(points, fill=fill)


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """Load Pillow's bundled font afresh (~0.1 ms): a FreeType face is per thread."""
    return ImageFont.load_default(size=size)


def _caption(image: Image.Image, prompt: str) -> None:
    """Write the prompt's start on a dark band; glyphs the font lacks draw as boxes."""
    text = "".join(c if c.isprintable() else " " for c in prompt)
    text = " ".join(text.split())[:CAPTION_CHARS]
    if not text:
        return
    width, height = image.size
    margin = max(2, min(width, height) // 40)
    size = max(8, min(width, height) // 20)
    draw = ImageDraw.Draw(image, "RGBA")
    length = draw.textlength(text, font=_font(size))
    if length > width - 2 * margin:  # shrink to fit, but stay legible
        size = max(8, int(size * (width - 2 * margin) / length))
    font = _font(size)
    band = size + 2 * margin
    draw.rectangle((0, height - band, width, height), fill=(0, 0, 0, 120))
    draw.text(
        (margin, height - band / 2), text, font=font, fill=(255, 255, 255), anchor="lm"
    )


@releasing
def render_image(prompt: str, seed: int, width: int, height: int) -> bytes:
    """Draw the demo picture as a PNG, byte-identical for the same inputs."""
    if width < 1 or height < 1:
        raise ValueError("an image needs at least one pixel on each side")
    rng = _seeded(prompt, seed)
    image = _background(rng, width, height)
    _shapes(rng, image)
    _caption(image, prompt)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)  # no text chunks, no time
    return buffer.getvalue()


def _encoder() -> Literal["libx264", "h264"]:
    """Prefer libx264 by name; FFmpeg's "h264" encoder is the fallback."""
    return "libx264" if "libx264" in av.codecs_available else "h264"


@releasing
def render_video(
    prompt: str,
    seed: int,
    width: int,
    height: int,
    seconds: float,
    fps: int = 24,
    on_frame: Callable[[float], None] | None = None,
) -> bytes:
    """Encode the demo clip as an H.264 MP4 (faststart), shapes orbiting the caption.

    The same inputs give the same bytes. yuv420p needs even sides, so odd ones
    are rounded down; `on_frame` hears the fraction done at most PROGRESS_CALLS
    times, the last time with 1.0.
    """
    width, height = width - width % 2, height - height % 2
    total = round(seconds * fps)
    if width < 2 or height < 2 or fps < 1 or total < 1:
        raise ValueError("a clip needs at least one frame of 2×2 pixels")
    rng = _seeded(prompt, seed)
    base = _background(rng, width, height)
    _caption(base, prompt)
    orbits = [
        (
            (*_colour(rng), rng.randint(90, 190)),  # colour
            rng.uniform(0.04, 0.14) * min(width, height),  # radius
            rng.uniform(0.1, 0.4),  # reach across
            rng.uniform(0.1, 0.4),  # reach down
            rng.choice((1, 2, 3)),  # turns per clip across
            rng.choice((1, 2)),  # turns per clip down
            rng.uniform(0, 2 * math.pi),  # phase
        )
        for _ in range(rng.randint(3, 6))
    ]
    step = math.ceil(total / PROGRESS_CALLS)
    # A file, not a BytesIO: faststart moves the index by reopening the output
    # by name, which a Python file object cannot be (FFmpeg sees "<none>").
    with tempfile.TemporaryDirectory(prefix="demo-clip-") as folder:
        path = Path(folder) / "clip.mp4"
        with av.open(
            str(path), mode="w", format="mp4", options={"movflags": "+faststart"}
        ) as container:
            stream = container.add_stream(
                _encoder(), rate=fps, options={"crf": "23", "preset": "veryfast"}
            )
            stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
            stream.time_base = Fraction(1, fps)
            # One thread: x264's frame threads made the bytes vary run to run and
            # were no faster on 2 cores, where drawing the frames competes with them.
            stream.codec_context.thread_count = 1
            to_yuv = VideoReformatter()  # one scaler for all frames, not one each
            for index in range(total):
                picture = base.copy()
                draw = ImageDraw.Draw(picture, "RGBA")
                turn = 2 * math.pi * index / total
                for fill, radius, reach_x, reach_y, spin_x, spin_y, phase in orbits:
                    x = width * (0.5 + reach_x * math.sin(spin_x * turn + phase))
                    y = height * (0.5 + reach_y * math.cos(spin_y * turn + phase))
                    box = (x - radius, y - radius, x + radius, y + radius)
                    draw.ellipse(box, fill)
                rgba = VideoFrame.from_bytes(  # PyAV takes raw bytes only as rgba
                    picture.convert("RGBA").tobytes(), width, height, format="rgba"
                )
                frame = to_yuv.reformat(rgba, format="yuv420p")
                frame.pts = index
                container.mux(stream.encode(frame))
                done = index + 1
                if on_frame is not None and (done % step == 0 or done == total):
                    on_frame(done / total)
            container.mux(stream.encode(None))
        return path.read_bytes()


def _webp(image: Image.Image, max_side: int, xmp: bytes) -> tuple[bytes, int, int]:
    """Shrink (never enlarge) and encode as WebP q80 with only the given XMP."""
    image = ImageOps.exif_transpose(image)  # upright first: EXIF is not kept
    has_alpha = image.mode in ("RGBA", "LA", "PA") or (
        image.mode == "P" and "transparency" in image.info
    )
    image = image.convert("RGBA" if has_alpha else "RGB")
    image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    extra = {"xmp": xmp} if xmp else {}
    image.save(buffer, format="WEBP", quality=80, **extra)  # no exif, no icc
    return buffer.getvalue(), image.width, image.height


@releasing
def thumbnail_webp(
    image_bytes: bytes, max_side: int = 512, xmp: bytes = b""
) -> tuple[bytes, int, int]:
    """Make a gallery-sized WebP of an image; returns (bytes, width, height)."""
    with Image.open(io.BytesIO(image_bytes)) as image:
        image.draft("RGB", (max_side, max_side))  # JPEG: decode at a smaller scale
        return _webp(image, max_side, xmp)


@releasing
def picture_thumbnail(
    image: Image.Image, max_side: int = 512, xmp: bytes = b""
) -> tuple[bytes, int, int]:
    """Make a gallery-sized WebP of decoded pixels; returns (bytes, width, height)."""
    return _webp(image, max_side, xmp)


@releasing
def video_poster(
    video_bytes: bytes, max_side: int = 512, xmp: bytes = b""
) -> tuple[bytes, int, int]:
    """Make the clip's first frame into a WebP poster; returns (bytes, w, h)."""
    with av.open(io.BytesIO(video_bytes), mode="r") as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            image: Image.Image = frame.to_image()  # type: ignore[no-untyped-call]
            return _webp(image, max_side, xmp)
    raise ValueError("the video has no frames")


@releasing
def video_frames(
    video_bytes: bytes,
    every_seconds: float,
    most: int,
    max_side: int = 512,
    xmp: bytes = b"",
) -> list[bytes]:
    """Sample a clip past its first frame: one WebP each `every_seconds`, at most
    `most`, for a moderation provider (the poster shows the first frame)."""
    frames: list[bytes] = []
    mark = every_seconds
    with av.open(io.BytesIO(video_bytes), mode="r") as container:
        stream = container.streams.video[0]
        for frame in container.decode(stream):
            if len(frames) >= most:
                break
            if frame.time is None or frame.time < mark:
                continue
            image: Image.Image = frame.to_image()  # type: ignore[no-untyped-call]
            frames.append(_webp(image, max_side, xmp)[0])
            while mark <= frame.time:  # a gap longer than a step skips its marks
                mark += every_seconds
    return frames


def video_info(video_bytes: bytes) -> tuple[int, int, float]:
    """Read a clip's width, height and duration in seconds without decoding it."""
    with av.open(io.BytesIO(video_bytes), mode="r") as container:
        stream = container.streams.video[0]
        if stream.duration is not None and stream.time_base is not None:
            seconds = float(stream.duration * stream.time_base)
        elif container.duration is not None:
            seconds = container.duration / av.time_base
        else:
            seconds = 0.0
        return stream.codec_context.width, stream.codec_context.height, seconds
