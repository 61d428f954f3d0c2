"""Finish one output before it is stored: labeled master, labeled thumbnail.

A clip, when outputs are checked, also gives frames sampled past its poster.

Thumbnails and posters are made from the labeled master, so they show its
visible label, and carry its TC260 label too (CONTRACT §10). Synchronous and
CPU-bound: the worker runs it in an executor.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from ...labels.finish import label_master, seal
from ...labels.implicit import LabelError, make_label
from ...settings import LabelsSettings
from ..upstreams.base import UpstreamError
from .demo_art import picture_thumbnail, video_frames, video_info, video_poster

_LOGGER: Final = logging.getLogger(__name__)
# A clip is checked by its poster (its first frame) and by a frame each
# FRAME_EVERY_SECONDS after it, at most FRAMES_CHECKED in all: a 5 s clip is five
# image checks, a 15 s clip ten.
FRAME_EVERY_SECONDS: Final = 1.0
FRAMES_CHECKED: Final = 10


@dataclass(frozen=True, slots=True)
class Finished:
    """The files to store for one output, and what a work says about its size."""

    data: bytes
    thumb: bytes
    # A clip's own size and length; None for pictures (the request's size stands).
    video: tuple[int, int, float] | None
    # A clip's frames after its poster, for the output check (never shown), with
    # the clip's TC260 label as its poster has.
    frames: tuple[bytes, ...] = ()


def finish(
    settings: LabelsSettings,
    data: bytes,
    extension: str,
    work_id: str,
    *,
    frames: bool = False,
) -> Finished:
    """Label the output as work `work_id`, then make its WebP thumbnail from it,
    and (with `frames`) a clip's frames to check beside its poster.

    A file that cannot be labeled is an upstream failure: nothing is stored.
    """
    try:
        master = label_master(settings, data, extension, work_id)
        packet = master.derivative_packet
        video, sampled = None, []
        if master.picture is None:  # a clip: its poster is its first frame
            video = video_info(master.data)
            thumb, _, _ = video_poster(master.data, xmp=packet)
            if frames:  # from the labeled master: what people will see; they are
                # files too (a provider fetches them), so they carry its label
                most = FRAMES_CHECKED - 1
                sampled = video_frames(
                    master.data, FRAME_EVERY_SECONDS, most, xmp=packet
                )
        else:  # from the pixels just encoded: the master is not decoded again
            thumb, _, _ = picture_thumbnail(master.picture, xmp=packet)
        thumb = seal(settings, thumb, "webp", make_label(settings, work_id))
    except LabelError as err:
        _LOGGER.warning("an output could not be labeled: %s", err)
        raise UpstreamError("UPSTREAM_FAILED", transient=False) from err
    return Finished(master.data, thumb, video, tuple(sampled))
