"""The visible label: `AI生成` bottom-right on a plate, sized by the font's metrics."""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from PIL import Image, ImageDraw, ImageFont

TEXT: Final = "AI生成"
# The bundled font: a subset of Noto Sans CJK SC Bold (SIL OFL 1.1, see fonts/).
FONT_PATH: Final = Path(__file__).with_name("fonts") / "label-sans-bold.otf"
# The text's cap height as a share of the image's shortest side (GB 45438 asks 5 %).
CAP_SHARE: Final = 0.06
MIN_CAP_SHARE: Final = 0.05
PLATE: Final = (16, 16, 16, 168)  # dark and translucent: white text reads on anything
INK: Final = (255, 255, 255, 255)


def font_metrics(path: Path = FONT_PATH) -> tuple[int, int]:
    """Read (OS/2 sCapHeight, head unitsPerEm) from an OpenType file's tables."""
    data = path.read_bytes()
    (count,) = struct.unpack_from(">H", data, 4)
    tables = {}
    for index in range(count):
        tag, _, offset, _ = struct.unpack_from(">4sIII", data, 12 + 16 * index)
        tables[tag] = offset
    (units,) = struct.unpack_from(">H", data, tables[b"head"] + 18)
    os2 = tables[b"OS/2"]
    (version,) = struct.unpack_from(">H", data, os2)
    if version < 2:  # sCapHeight arrived with OS/2 version 2
        raise ValueError(f"{path.name}: its OS/2 table has no cap height")
    (cap,) = struct.unpack_from(">h", data, os2 + 88)
    return cap, units


@dataclass(frozen=True, slots=True)
class Stamp:
    """The label for one picture size: the plate to paste, where, how big."""

    overlay: Image.Image  # RGBA: the plate with the text on it
    x: int
    y: int
    font_size: int
    cap_height: float  # pixels, from the font's metrics at font_size

    @property
    def box(self) -> tuple[int, int, int, int]:
        """The plate's pixels: left, top, right, bottom (exclusive)."""
        return (
            self.x,
            self.y,
            self.x + self.overlay.width,
            self.y + self.overlay.height,
        )

    def record(self, width: int, height: int) -> dict[str, Any]:
        """Describe the label independently of scale (thumbnails share it)."""
        short = min(width, height)
        left, top, right, bottom = self.box
        return {
            "text": TEXT,
            "corner": "bottom-right",
            "cap_height": round(self.cap_height / short, 4),
            "box": [
                round(left / width, 4),
                round(top / height, 4),
                round(right / width, 4),
                round(bottom / height, 4),
            ],
        }


@functools.lru_cache(maxsize=32)
def stamp_for(width: int, height: int) -> Stamp:
    """Size the label for a picture: cap height CAP_SHARE of the shortest side."""
    cap_units, em = font_metrics()
    short = min(width, height)
    size = max(1, math.ceil(CAP_SHARE * short * em / cap_units))
    cap = size * cap_units / em
    font = ImageFont.truetype(str(FONT_PATH), size)
    left, top, right, bottom = (
        math.floor(v) if i < 2 else math.ceil(v)
        for i, v in enumerate(font.getbbox(TEXT, anchor="ls"))
    )
    pad_x, pad_y = max(1, round(0.45 * cap)), max(1, round(0.35 * cap))
    plate_w = right - left + 2 * pad_x
    plate_h = bottom - top + 2 * pad_y
    overlay = Image.new("RGBA", (plate_w, plate_h), (0, 0, 0, 0))
    draw = ImageDraw.Draw(overlay)
    draw.rounded_rectangle(
        (0, 0, plate_w - 1, plate_h - 1), radius=max(1, round(0.3 * cap)), fill=PLATE
    )
    draw.text((pad_x - left, pad_y - top), TEXT, font=font, fill=INK, anchor="ls")
    margin = max(1, round(0.025 * short))
    x = max(0, width - margin - plate_w)
    y = max(0, height - margin - plate_h)
    return Stamp(overlay, x, y, size, cap)


def draw_label(image: Image.Image) -> tuple[Image.Image, Stamp]:
    """Return the picture (RGB or RGBA) with the label composited in its corner."""
    stamp = stamp_for(image.width, image.height)
    if image.mode == "RGBA":
        image.alpha_composite(stamp.overlay, (stamp.x, stamp.y))
        return image, stamp
    if image.mode != "RGB":
        image = image.convert("RGB")
    image.paste(stamp.overlay, (stamp.x, stamp.y), stamp.overlay)
    return image, stamp
