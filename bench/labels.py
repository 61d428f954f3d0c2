"""AI labels: what finishing costs per 1024² image and per 5 s 720p clip.

Measures what the worker runs for each output (service/studio/media/finishing.py:
visible label, encode, TC260 label, thumbnail or poster, read back and verify,
and with --c2pa the C2PA signature of both files), in this process, pinned to
one CPU, with the service's default settings.

Baselines, timed in the same run alternately with the labeled side:
- image `encode-only`: decode the upstream PNG, encode it again as the finisher
  does (Pillow, PNG level 6) and make its WebP thumbnail: what storing a
  re-encoded file and its thumbnail costs with no label at all;
- clip `transcode-only`: decode the upstream MP4 and encode every frame again
  with the finisher's encoder settings (libx264 crf 20 veryfast, faststart),
  then make its poster: the re-encode a visible label on every frame requires.
And what the worker did before labels (`unlabeled`): store the upstream's bytes
as they came and make only the thumbnail (image) or the poster (clip).
The ratios (labeled / baseline, medians of pairs) are what labeling adds.

Pictures come twice: the demo's flat drawing, and the same drawing with film
grain over it, which compresses as a photograph does (a real model's output is
closer to it: its PNG encode costs several times the drawing's).
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import av
from PIL import Image

from service.labels.carriers import PNG_LEVEL
from service.labels.local_ca import make_chain
from service.labels.video import MOVFLAGS
from service.settings import LabelsSettings
from service.studio.media.demo_art import (
    render_image,
    render_video,
    thumbnail_webp,
    video_info,
    video_poster,
)
from service.studio.media.finishing import finish

SECRET = "bench-secret-key-0123456789abcdef-0123456789"


def encode_only(png: bytes) -> None:
    """Re-encode the picture and thumbnail it, with no label."""
    with Image.open(io.BytesIO(png)) as image:
        image.load()
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=PNG_LEVEL)
    thumbnail_webp(buffer.getvalue())


def grainy(png: bytes) -> bytes:
    """The picture with film grain over it: it compresses as a photograph does."""
    with Image.open(io.BytesIO(png)) as image:
        drawing = image.convert("RGB")
    grain = Image.merge("RGB", [Image.effect_noise(drawing.size, 12) for _ in range(3)])
    buffer = io.BytesIO()
    Image.blend(drawing, grain, 0.15).save(buffer, format="PNG", compress_level=1)
    return buffer.getvalue()


def transcode_only(clip: bytes) -> None:
    """Decode and encode every frame again, then make the poster, with no label."""
    with (
        av.open(io.BytesIO(clip), mode="r") as source,
        tempfile.TemporaryDirectory() as folder,
    ):
        video_in = source.streams.video[0]
        path = Path(folder) / "out.mp4"
        with av.open(
            str(path), mode="w", format="mp4", options={"movflags": MOVFLAGS}
        ) as target:
            rate = video_in.average_rate or Fraction(24)
            out: Any = target.add_stream(
                "libx264", rate=rate, options={"crf": "20", "preset": "veryfast"}
            )
            out.width = video_in.codec_context.width
            out.height = video_in.codec_context.height
            out.pix_fmt = "yuv420p"
            out.time_base = out.codec_context.time_base = video_in.time_base
            for frame in source.decode(video_in):
                picture = frame.to_image()  # type: ignore[no-untyped-call]
                # the same RGB round trip as labeling, without the label
                again = av.VideoFrame.from_image(picture)  # type: ignore[no-untyped-call]
                again = again.reformat(format="yuv420p")
                again.pts, again.time_base = frame.pts, frame.time_base
                target.mux(out.encode(again))
            target.mux(out.encode(None))
        video_poster(path.read_bytes())


def unlabeled_image(png: bytes) -> None:
    """The worker before labels: the thumbnail only."""
    thumbnail_webp(png)


def unlabeled_clip(clip: bytes) -> None:
    """The worker before labels: the clip's size and its poster only."""
    video_info(clip)
    video_poster(clip)


def _timed(action: Callable[[], object]) -> float:
    started = time.process_time()
    action()
    return time.process_time() - started


def pairs(
    labeled: Callable[[], object], baseline: Callable[[], object], rounds: int
) -> tuple[list[float], list[float]]:
    """Alternate the two sides, swapping who goes first; CPU seconds each."""
    ours, theirs = [], []
    for index in range(rounds):
        if index % 2:
            ours.append(_timed(labeled))
            theirs.append(_timed(baseline))
        else:
            theirs.append(_timed(baseline))
            ours.append(_timed(labeled))
    return ours, theirs


def report(name: str, baseline: str, ours: list[float], theirs: list[float]) -> None:
    ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
    print(
        f"{name:<28} labeled {statistics.median(ours) * 1000:6.0f} ms"
        f"  {baseline:>14} {statistics.median(theirs) * 1000:6.0f} ms"
        f"  ratio {statistics.median(ratios):.2f}"
        f" (range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="image pairs")
    parser.add_argument("--clip-rounds", type=int, default=3, help="clip pairs")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {0})
    png = render_image("a glass lighthouse at dusk", 7, 1024, 1024)
    photo = grainy(png)
    clip = render_video("waves on black sand", 7, 1280, 720, 5.0, fps=24)
    plain = LabelsSettings(secret_key=SECRET)
    with tempfile.TemporaryDirectory() as folder:
        chain, key, _ = make_chain(days=30)
        (Path(folder) / "chain.pem").write_bytes(chain)
        (Path(folder) / "key.pem").write_bytes(key)
        signed = LabelsSettings(
            secret_key=SECRET,
            c2pa_cert=Path(folder) / "chain.pem",
            c2pa_key=Path(folder) / "key.pem",
        )
        print(
            f"1024x1024 PNG: {len(png)} bytes, grainy {len(photo)};"
            f" 5 s 1280x720 24 fps: {len(clip)} bytes"
        )
        cases = (
            ("image", png, "png", args.rounds, {
                "encode-only": functools.partial(encode_only, png),
                "unlabeled": functools.partial(unlabeled_image, png),
            }),
            ("grainy image", photo, "png", args.rounds, {
                "encode-only": functools.partial(encode_only, photo),
                "unlabeled": functools.partial(unlabeled_image, photo),
            }),
            ("5 s 720p clip", clip, "mp4", args.clip_rounds, {
                "transcode-only": functools.partial(transcode_only, clip),
                "unlabeled": functools.partial(unlabeled_clip, clip),
            }),
        )  # fmt: skip
        for kind, data, extension, rounds, baselines in cases:
            if rounds < 1:  # --clip-rounds 0: images only
                continue
            for name, settings in (("labels", plain), ("labels + C2PA", signed)):
                labeled = functools.partial(finish, settings, data, extension, "b")
                for baseline, action in baselines.items():
                    ours, theirs = pairs(labeled, action, rounds)
                    report(f"{kind}, {name}", baseline, ours, theirs)


if __name__ == "__main__":
    main()
