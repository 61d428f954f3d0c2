"""The demo model's media: real PNG, H.264 MP4 and WebP files, drawn from the seed."""

from __future__ import annotations

import io

import av
import pytest
from PIL import Image

from service.studio.media.demo_art import (
    render_image,
    render_video,
    thumbnail_webp,
    video_frames,
    video_info,
    video_poster,
)

PROMPT = "a red fox asleep in fresh snow, 雪地里的狐狸, watercolour"
SECONDS, FPS = 1.5, 24


@pytest.fixture(scope="module")
def progress() -> list[float]:
    """Collect what the clip's encoder reports."""
    return []


@pytest.fixture(scope="module")
def clip(progress: list[float]) -> bytes:
    """Encode one small clip for the whole module: encoding is the slow part."""
    return render_video(PROMPT, 7, 320, 240, SECONDS, FPS, on_frame=progress.append)


def test_the_png_opens_at_the_requested_size() -> None:
    """Pillow reads the bytes back as a PNG of exactly width × height."""
    with Image.open(io.BytesIO(render_image(PROMPT, 1, 640, 360))) as image:
        image.load()
        assert (image.format, image.size) == ("PNG", (640, 360))


def test_the_same_seed_draws_the_same_png() -> None:
    """Equal inputs give equal bytes, so a retried job stores the same picture."""
    assert render_image(PROMPT, 42, 256, 192) == render_image(PROMPT, 42, 256, 192)


def test_another_seed_or_prompt_draws_another_png() -> None:
    """The seed and the prompt both steer the composition."""
    first = render_image(PROMPT, 1, 256, 256)
    assert render_image(PROMPT, 2, 256, 256) != first
    assert render_image(PROMPT + "!", 1, 256, 256) != first


def test_prompts_with_odd_characters_still_render() -> None:
    """Control characters, emoji and an empty prompt do not break the caption."""
    for prompt in ("", "\x00\n\t line", "🦊" * 100, "x" * 5000):
        with Image.open(io.BytesIO(render_image(prompt, 3, 64, 48))) as image:
            assert image.size == (64, 48)


def test_the_clip_is_h264_in_mp4_with_every_frame(clip: bytes) -> None:
    """PyAV decodes the right number of H.264 frames at the rounded-down size."""
    with av.open(io.BytesIO(clip), mode="r") as container:
        assert "mp4" in container.format.name
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.codec_context.pix_fmt == "yuv420p"
        frames = list(container.decode(stream))
    assert len(frames) == round(SECONDS * FPS)
    assert (frames[0].width, frames[0].height) == (320, 240)


def test_the_clip_starts_with_its_index(clip: bytes) -> None:
    """faststart puts moov before mdat, so browsers can play while downloading."""
    assert 0 <= clip.index(b"moov") < clip.index(b"mdat")


def test_the_clip_lasts_as_long_as_asked(clip: bytes) -> None:
    """video_info reads back the size and a duration within 0.1 s of the request."""
    width, height, seconds = video_info(clip)
    assert (width, height) == (320, 240)
    assert seconds == pytest.approx(SECONDS, abs=0.1)


def test_the_same_seed_encodes_the_same_mp4(clip: bytes) -> None:
    """A retried job stores the same clip, byte for byte."""
    assert render_video(PROMPT, 7, 320, 240, SECONDS, FPS) == clip


def test_another_seed_encodes_another_mp4(clip: bytes) -> None:
    """The seed steers the animation."""
    assert render_video(PROMPT, 8, 320, 240, SECONDS, FPS) != clip


def test_progress_rises_to_one_in_at_most_twenty_calls(
    clip: bytes, progress: list[float]
) -> None:
    """The worker can report progress without flooding its channel."""
    assert 1 <= len(progress) <= 20
    assert progress == sorted(set(progress))
    assert all(0 < fraction <= 1 for fraction in progress)
    assert progress[-1] == 1.0


def test_odd_clip_sides_are_rounded_down_to_even() -> None:
    """yuv420p needs even sides; an odd request is trimmed, not refused."""
    width, height, _ = video_info(render_video(PROMPT, 1, 101, 75, 0.25, 12))
    assert (width, height) == (100, 74)


def test_a_clip_without_frames_is_refused() -> None:
    """Zero seconds is a caller's mistake, not an empty file."""
    with pytest.raises(ValueError, match="frame"):
        render_video(PROMPT, 1, 64, 64, 0.0)


def test_thumbnails_are_webp_with_the_longest_side_512() -> None:
    """A large picture shrinks to 512 on its long side and keeps its shape."""
    data, width, height = thumbnail_webp(render_image(PROMPT, 5, 1024, 768))
    assert (width, height) == (512, 384)
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == ("WEBP", (512, 384))
        assert "exif" not in image.info
        assert "icc_profile" not in image.info


def test_small_pictures_are_not_upscaled() -> None:
    """A thumbnail never invents pixels."""
    data, width, height = thumbnail_webp(render_image(PROMPT, 5, 200, 120))
    assert (width, height) == (200, 120)
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (200, 120)


def test_thumbnails_drop_metadata_and_honour_orientation() -> None:
    """EXIF (camera, GPS, orientation) is applied, then left out of the WebP."""
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90° clockwise to display
    exif[0x010F] = "Camera Maker"
    buffer = io.BytesIO()
    Image.new("RGB", (600, 300), (200, 40, 40)).save(buffer, "JPEG", exif=exif)
    data, width, height = thumbnail_webp(buffer.getvalue())
    assert (width, height) == (256, 512)
    with Image.open(io.BytesIO(data)) as image:
        assert not image.getexif()
        assert "exif" not in image.info


def test_the_poster_is_a_webp_of_the_first_frame(clip: bytes) -> None:
    """The gallery shows a still of the clip before it plays."""
    data, width, height = video_poster(clip)
    assert (width, height) == (320, 240)
    with Image.open(io.BytesIO(data)) as image:
        assert (image.format, image.size) == ("WEBP", (320, 240))


def test_the_poster_shrinks_to_max_side(clip: bytes) -> None:
    """max_side bounds the poster's longest side too."""
    _, width, height = video_poster(clip, max_side=160)
    assert (width, height) == (160, 120)


def test_frames_are_sampled_each_step_after_the_first_up_to_the_most(
    clip: bytes,
) -> None:
    """1.5 s at 24 fps: frames at 0.5 and 1.0 s (the poster is the one at 0)."""
    frames = video_frames(clip, 0.5, 9, max_side=160)
    assert len(frames) == 2
    poster, _, _ = video_poster(clip, max_side=160)
    pictures = [Image.open(io.BytesIO(data)) for data in (poster, *frames)]
    assert [(p.format, p.size) for p in pictures] == [("WEBP", (160, 120))] * 3
    pixels = [p.convert("RGB").tobytes() for p in pictures]
    assert len(set(pixels)) == 3  # the shapes move: three different stills
    assert len(video_frames(clip, 0.5, 1)) == 1
    assert video_frames(clip, 2.0, 9) == []  # shorter than one step
