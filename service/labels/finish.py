"""Finish a generated file: visible label, encode, TC260 label, C2PA, read back.

Every step is synchronous and CPU-bound: callers run it in an executor.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from typing import Any, Final

from PIL import Image, ImageOps

from ..settings import LabelsSettings
from .carriers import encode_image, mp4_aigc, xmp_box, xmp_packets
from .credentials import GOOD_STATES, read_credentials, sign, trust_anchors
from .explicit import draw_label
from .implicit import (
    TRAINED,
    LabelError,
    XmpFacts,
    label_json,
    make_label,
    verifies,
    xmp_packet,
)
from .video import label_video

_PROFILED_MODES: Final = frozenset({"RGB", "RGBA", "P", "L", "LA", "PA"})


@dataclass(frozen=True, slots=True)
class Labeled:
    """A labeled master and the XMP packet its thumbnails and posters carry."""

    data: bytes
    derivative_packet: bytes
    # A picture's labeled pixels, as encoded: its thumbnail needs no decode.
    picture: Image.Image | None = None


@dataclass(slots=True)
class Findings:
    """What a file carries: its TC260 labels, source types, our record."""

    labels: list[str]
    source_types: list[str]
    explicit: list[str]

    def parsed(self) -> dict[str, Any] | None:
        """The one label's JSON object, or None (none, several, or not JSON)."""
        if len(self.labels) != 1:
            return None
        try:
            value = json.loads(self.labels[0])
        except ValueError:
            return None
        return value if isinstance(value, dict) else None


def read_labels(data: bytes, extension: str) -> Findings:
    """Collect every label a file carries, wherever its format keeps one."""
    facts = XmpFacts()
    for packet in xmp_packets(data, extension):
        facts.add(packet)
    labels = list(facts.aigc)
    if extension == "mp4":
        labels += mp4_aigc(data)
    return Findings(labels, facts.source_types, facts.explicit)


def label_master(
    settings: LabelsSettings, data: bytes, extension: str, work_id: str
) -> Labeled:
    """Draw the visible label, re-encode, and write the one TC260 label."""
    label = make_label(settings, work_id)
    if extension == "mp4":
        try:
            video, stamp, width, height = label_video(data, label_json(label))
        except (ValueError, OSError) as err:  # av's errors are OSErrors
            raise LabelError(f"cannot label the clip: {err}") from err
        record = stamp.record(width, height)
        labeled = video + xmp_box(xmp_packet(None, record))
        sealed = seal(settings, labeled, extension, label)
        return Labeled(sealed, xmp_packet(label, record))
    else:
        try:
            with Image.open(io.BytesIO(data)) as source:
                source.load()
                # A colour profile stays with the pixels it describes (not CMYK's).
                profiled = source.mode in _PROFILED_MODES
                icc = source.info.get("icc_profile") if profiled else None
                image = ImageOps.exif_transpose(source)  # EXIF is not kept
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as err:
            raise LabelError(f"cannot read the picture: {err}") from err
        has_alpha = image.mode in ("RGBA", "LA", "PA") or (
            image.mode == "P" and "transparency" in image.info
        )
        image = image.convert("RGBA" if has_alpha else "RGB")
        image, stamp = draw_label(image)
        if icc:
            image.info["icc_profile"] = icc
        packet = xmp_packet(label, stamp.record(image.width, image.height))
        encoded = encode_image(image, extension, packet)
        return Labeled(seal(settings, encoded, extension, label), packet, image)


def seal(
    settings: LabelsSettings, data: bytes, extension: str, label: dict[str, str]
) -> bytes:
    """Sign a labeled file (C2PA, when configured) and check it as it is stored."""
    data = sign(settings, data, extension, f"{label['ProduceID']}.{extension}")
    _verify(settings, data, extension, label)
    if settings.c2pa_cert is not None:
        found = read_credentials(data, extension, trust_anchors(settings))
        if found is None or found.state not in GOOD_STATES or found.manifests != 1:
            raise LabelError("the C2PA manifest did not read back as signed")
    return data


def _verify(
    settings: LabelsSettings, data: bytes, extension: str, label: dict[str, str]
) -> None:
    """Read the file back: exactly our one label, verifying, and the source type."""
    findings = read_labels(data, extension)
    if len(findings.labels) != 1:
        raise LabelError(f"{len(findings.labels)} TC260 labels, not one")
    if findings.parsed() != label or not verifies(label, settings):
        raise LabelError("the TC260 label did not read back as written")
    if TRAINED not in findings.source_types:
        raise LabelError("the IPTC digital source type is missing")
