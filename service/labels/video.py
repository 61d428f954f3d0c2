"""Re-encode a clip with the visible label on every frame and the AIGC key.

The upstream's audio is copied packet for packet; its metadata is not carried
over, so an upstream's own label never survives next to ours.
"""

from __future__ import annotations

import io
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Final, Literal

import av
from av.video.frame import VideoFrame
from av.video.reformatter import VideoReformatter

from .carriers import AIGC_KEY
from .explicit import Stamp, draw_label

# faststart: the index first, for playback while downloading; use_metadata_tags:
# without it the mp4 muxer drops the AIGC key silently.
MOVFLAGS: Final = "+faststart+use_metadata_tags"


def _encoder() -> Literal["libx264", "h264"]:
    return "libx264" if "libx264" in av.codecs_available else "h264"


def label_video(data: bytes, aigc: str) -> tuple[bytes, Stamp, int, int]:
    """Return (MP4 bytes, the stamp drawn, width, height)."""
    stamp: Stamp | None = None
    # A file, not a BytesIO: faststart reopens the output by name.
    with (
        av.open(io.BytesIO(data), mode="r") as source,
        tempfile.TemporaryDirectory(prefix="label-clip-") as folder,
    ):
        if not source.streams.video:
            raise ValueError("the clip has no video stream")
        video_in = source.streams.video[0]
        audio_in = source.streams.audio[0] if source.streams.audio else None
        width = video_in.codec_context.width
        height = video_in.codec_context.height
        width, height = width - width % 2, height - height % 2
        path = Path(folder) / "labeled.mp4"
        with av.open(
            str(path), mode="w", format="mp4", options={"movflags": MOVFLAGS}
        ) as target:
            target.metadata[AIGC_KEY] = aigc
            rate = video_in.average_rate or video_in.guessed_rate or Fraction(24)
            options = {"crf": "20", "preset": "veryfast"}
            video_out: Any = target.add_stream(_encoder(), rate=rate, options=options)
            video_out.width, video_out.height = width, height
            video_out.pix_fmt = "yuv420p"
            video_out.time_base = video_in.time_base
            video_out.codec_context.time_base = video_in.time_base
            audio_out = target.add_stream_from_template(audio_in) if audio_in else None
            to_yuv = VideoReformatter()
            streams = [s for s in (video_in, audio_in) if s is not None]
            for packet in source.demux(*streams):
                if packet.stream is audio_in:
                    if packet.dts is None or audio_out is None:
                        continue
                    packet.stream = audio_out
                    target.mux(packet)
                    continue
                for frame in packet.decode():
                    if not isinstance(frame, VideoFrame):
                        continue
                    picture = frame.to_image()  # type: ignore[no-untyped-call]
                    if picture.size != (width, height):
                        picture = picture.crop((0, 0, width, height))
                    picture, stamp = draw_label(picture)
                    out = to_yuv.reformat(
                        VideoFrame.from_image(picture),  # type: ignore[no-untyped-call]
                        format="yuv420p",
                    )
                    out.pts, out.time_base = frame.pts, frame.time_base
                    target.mux(video_out.encode(out))
            target.mux(video_out.encode(None))
        if stamp is None:
            raise ValueError("the clip has no frames")
        return path.read_bytes(), stamp, width, height
