"""Our request fields in the shapes vendor APIs take (ratios, data URIs, progress).

The queue protocols (fal, replicate) share these small translations: a size
becomes the nearest aspect ratio a model offers, a reference image travels as a
data URI, a vendor's free-text logs become a progress fraction, and a refusal's
text says whether it was the content policy.
"""

from __future__ import annotations

import base64
import math
import re
from collections.abc import Iterable, Sequence
from typing import Any, Final

from .fetch import sniff

MEDIA_TYPES: Final = {"png": "image/png", "jpg": "image/jpeg", "webp": "image/webp"}
# The seeds DashScope takes (0..2**31-1, an int32) and Ark and MiniMax store
# as one; ours go up to 2**32-1.
INT32_SEEDS: Final = 2**31 - 1
# "45%" (tqdm, most runners) or "step 9/20" in a log line.
_PERCENT: Final = re.compile(r"(\d{1,3}(?:\.\d+)?)\s*%")
_STEPS: Final = re.compile(r"\b(\d{1,6})\s*/\s*(\d{1,6})\b")
# Words vendors use when their safety system refuses a prompt or a result.
# (Not a bare "safety": a field such as safety_tolerance may be what is invalid.)
_BLOCKED: Final = re.compile(
    r"content[ _-]?polic|nsfw|flagged|\bsensitive\b|moderat"
    r"|safety (?:system|checker|filter)|\bE005\b",
    re.IGNORECASE,
)


def data_uri(image: bytes) -> str:
    """Encode a reference image as a data URI (both vendors take one for a URL)."""
    extension = sniff(image)
    if extension not in MEDIA_TYPES:
        raise ValueError("a reference must be PNG, JPEG or WebP")
    encoded = base64.b64encode(image).decode()
    return f"data:{MEDIA_TYPES[extension]};base64,{encoded}"


def ratio(width: int, height: int) -> str:
    """Reduce a size to its aspect ratio, e.g. 1280x720 -> "16:9"."""
    divisor = math.gcd(width, height)
    return f"{width // divisor}:{height // divisor}"


def nearest_ratio(width: int, height: int, offered: Sequence[str]) -> str:
    """Pick the offered ratio ("W:H") closest to a size's shape."""

    def distance(choice: str) -> float:
        across, _, down = choice.partition(":")
        return abs(math.log((width / height) / (int(across) / int(down))))

    return min(offered, key=distance)


def log_fraction(lines: Iterable[str]) -> float | None:
    """Read how far a run is from its latest log line that says (None: silent)."""
    found: float | None = None
    for line in lines:
        if percent := _PERCENT.findall(line):
            value = float(percent[-1]) / 100
            if 0.0 <= value <= 1.0:
                found = value
                continue
        if steps := _STEPS.findall(line):
            done, total = (int(part) for part in steps[-1])
            if total > 0 and done <= total:
                found = done / total
    return found


def running(fraction: float | None) -> float:
    """Map a run's own fraction into the share of progress the run covers."""
    return 0.1 + 0.8 * (fraction or 0.0)


def says_blocked(body: Any) -> bool:
    """Tell whether a refusal's text (any string in it) names the safety system."""
    if isinstance(body, str):
        return _BLOCKED.search(body) is not None
    if isinstance(body, dict):
        return any(says_blocked(value) for value in body.values())
    if isinstance(body, list):
        return any(says_blocked(value) for value in body)
    return False


def int32_seed(seed: int) -> int:
    """Fold our seed into 0..2**31-1: the same seed always sends the same one."""
    return seed & INT32_SEEDS
