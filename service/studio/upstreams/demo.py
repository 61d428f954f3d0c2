"""The built-in demo upstream: offline, keyless, real PNG and H.264 MP4."""

from __future__ import annotations

import asyncio
import functools
from typing import Final

from .base import Output, Progress, Request

# Video is drawn at a lower frame rate: the clip keeps its length, costs less CPU.
DEMO_FPS: Final = 12
_STEPS: Final = 10


@functools.lru_cache(maxsize=32)
def _image(prompt: str, seed: int, width: int, height: int) -> bytes:
    """Draw (or recall) an image: the same inputs always give the same bytes."""
    from ..media.demo_art import render_image  # PyAV and Pillow: workers only

    return render_image(prompt, seed, width, height)


def _video(
    prompt: str, seed: int, width: int, height: int, seconds: float, fps: int
) -> bytes:
    """Draw a clip (in a worker's thread, where the encoder is loaded)."""
    from ..media.demo_art import render_video

    return render_video(prompt, seed, width, height, seconds, fps=fps)


class DemoUpstream:
    """Pretend to work for `seconds`, reporting progress, then draw real media."""

    def __init__(self, seconds: float) -> None:
        self._seconds = seconds
        # One clip encodes at a time: x264 holds ~100 MB per clip at 720p, and
        # on a few cores clips side by side finish no sooner than one by one.
        self._encoding = asyncio.Semaphore(1)

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Wait out the configured time in steps, then render in a thread."""
        if self._seconds > 0:
            for step in range(1, _STEPS + 1):
                await asyncio.sleep(self._seconds / _STEPS)
                await progress(0.8 * step / _STEPS)
        loop = asyncio.get_running_loop()
        if request.kind == "video":
            async with self._encoding:
                data = await loop.run_in_executor(
                    None,
                    functools.partial(
                        _video,
                        request.prompt,
                        request.seed,
                        request.width,
                        request.height,
                        request.seconds or 5.0,
                        DEMO_FPS,
                    ),
                )
            return [Output(data, "mp4")]
        outputs = []
        for index in range(request.count):
            data = await loop.run_in_executor(
                None,
                _image,
                request.prompt,
                (request.seed + index) % 2**32,
                request.width,
                request.height,
            )
            outputs.append(Output(data, "png"))
        return outputs

    async def aclose(self) -> None:
        """Nothing to release."""
