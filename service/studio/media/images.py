"""Prove an uploaded reference is a real still PNG, JPEG or WebP before keeping it.

The bytes decide, never the filename or the declared Content-Type: Pillow must
recognise the format, the header's size must be sane, and the whole image must
decode, so truncated files and decompression bombs are refused cheaply.
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Final

# Pillow format name -> (content type, extension); the only formats tried.
FORMATS: Final = {
    "PNG": ("image/png", "png"),
    "JPEG": ("image/jpeg", "jpg"),
    "WEBP": ("image/webp", "webp"),
}


class InvalidImage(Exception):
    """The bytes are not an image this service accepts (HTTP 400 INVALID_IMAGE)."""


@dataclass(frozen=True, slots=True)
class ImageInfo:
    """What the bytes turned out to be, for storing and serving them."""

    content_type: str
    extension: str
    width: int
    height: int


def inspect_image(data: bytes, *, max_side: int = 4096) -> ImageInfo:
    """Identify and fully decode an upload, or raise InvalidImage saying why.

    Animated PNG and WebP (more than one frame) are refused: a reference is one
    picture. Metadata is not checked here; re-encode to drop it.
    """
    if not data:
        raise InvalidImage("the file is empty")
    # Here: a `serve` loads Pillow with its first upload, never at start-up.
    from PIL import Image, UnidentifiedImageError

    try:
        with warnings.catch_warnings():
            # Pillow warns, then raises, past its global pixel limit; both refuse.
            # The filter is process-wide, so a thread may miss it; while max_side²
            # is under that limit, the side check below refuses such images anyway.
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=tuple(FORMATS)) as image:
                kind = FORMATS.get(image.format or "")
                if kind is None:
                    raise InvalidImage("only PNG, JPEG and WebP are accepted")
                width, height = image.size  # from the header: nothing decoded yet
                if width < 1 or height < 1:
                    raise InvalidImage("the image has no pixels")
                if width > max_side or height > max_side:
                    raise InvalidImage(f"the image is over {max_side} px on a side")
                if getattr(image, "n_frames", 1) > 1:
                    raise InvalidImage("animated images are not accepted")
                image.load()  # decode everything: truncation shows up only here
    except InvalidImage:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as error:
        raise InvalidImage("the image claims too many pixels") from error
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError) as e:
        raise InvalidImage("the file is not a readable PNG, JPEG or WebP") from e
    content_type, extension = kind
    return ImageInfo(content_type, extension, width, height)
