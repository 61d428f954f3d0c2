"""An independent reader of labels for the tests: ExifTool, not our own code."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import subprocess
import tempfile
from fractions import Fraction
from pathlib import Path
from typing import Any, Final

import av
from PIL import Image

TRAINED: Final = (
    "http://cv.iptc.org/newscodes/digitalsourcetype/trainedAlgorithmicMedia"
)
KEYS: Final = {
    "Label",
    "ContentProducer",
    "ProduceID",
    "ReservedCode1",
    "ContentPropagator",
    "PropagateID",
    "ReservedCode2",
}


def exiftool(data: bytes, suffix: str) -> list[tuple[str, Any]]:
    """Every tag ExifTool finds, duplicates kept, as (group:name, value)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"file.{suffix}"
        path.write_bytes(data)
        done = subprocess.run(
            ["exiftool", "-j", "-a", "-G1", "-u", str(path)],
            capture_output=True,
            check=True,
            text=True,
        )
    (tags,) = json.loads(done.stdout, object_pairs_hook=lambda pairs: pairs)
    return list(tags)


def tc260_labels(tags: list[tuple[str, Any]]) -> list[dict[str, Any]]:
    """Every TC260 label among the tags: XMP TC260:AIGC and MP4 Keys AIGC alike."""
    found = []
    for name, value in tags:
        group, _, tag = name.partition(":")
        if tag.lower() == "aigc" and group in ("XMP-TC260", "Keys", "ItemList"):
            found.append(json.loads(value, object_pairs_hook=dict))
    return found


def source_types(tags: list[tuple[str, Any]]) -> list[str]:
    """The IPTC digital source types among the tags."""
    return [value for name, value in tags if name.endswith(":DigitalSourceType")]


def expected_code(secret: str, producer: str, produce_id: str) -> str:
    """ReservedCode1 as CONTRACT §10 spells it, computed here independently."""
    key = hmac.new(secret.encode(), b"studio/aigc-label/v1", hashlib.sha256).digest()
    message = f"{producer}/{produce_id}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def assert_one_label(
    data: bytes, suffix: str, secret: str, produce_id: str | None = None
) -> dict[str, Any]:
    """Exactly one TC260 label with the seven keys, verifying, and the IPTC type."""
    tags = exiftool(data, suffix)
    labels = tc260_labels(tags)
    assert len(labels) == 1, labels
    (label,) = labels
    assert set(label) == KEYS
    assert label["Label"] == "1"
    if produce_id is not None:
        assert label["ProduceID"] == label["PropagateID"] == produce_id
    assert label["ReservedCode1"] == expected_code(
        secret, label["ContentProducer"], label["ProduceID"]
    )
    assert label["ReservedCode2"] == ""
    assert source_types(tags) == [TRAINED]
    return label


def clip_with_audio(path: Path, seconds: float = 2.0) -> bytes:
    """An upstream's MP4: H.264 video, AAC audio, and its own AIGC key."""
    with av.open(
        str(path), "w", format="mp4", options={"movflags": "+use_metadata_tags"}
    ) as container:
        container.metadata["AIGC"] = json.dumps({"Label": "1", "ProduceID": "theirs"})
        video = container.add_stream("libx264", rate=24)
        video.width, video.height, video.pix_fmt = 320, 240, "yuv420p"
        audio = container.add_stream("aac", rate=44100)
        audio.layout = "mono"
        frames = round(seconds * 24)
        for index in range(frames):
            picture = Image.new("RGB", (320, 240), (index * 5 % 255, 80, 160))
            frame = av.VideoFrame.from_image(picture)  # type: ignore[no-untyped-call]
            frame = frame.reformat(format="yuv420p")
            frame.pts = index
            container.mux(video.encode(frame))
        container.mux(video.encode(None))
        samples = 1024
        for index in range(round(seconds * 44100 / samples)):
            tone = bytes(
                int(127 * math.sin(2 * math.pi * 440 * (index * samples + n) / 44100))
                & 0xFF
                for n in range(samples)
            )
            sound = av.AudioFrame(format="u8", layout="mono", samples=samples)
            sound.planes[0].update(tone)
            sound.sample_rate = 44100
            sound.pts = index * samples
            sound.time_base = Fraction(1, 44100)
            container.mux(audio.encode(sound))
        container.mux(audio.encode(None))
    return path.read_bytes()
