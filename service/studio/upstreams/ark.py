"""The `ark` protocol: Volcengine Ark's Seedream images and Seedance video tasks.

Images are synchronous: `POST /api/v3/images/generations` with
`response_format: b64_json` answers the picture in `data[].b64_json` (one call
per image: Seedream has no `n`, and `max_images` is only a ceiling). Videos
are tasks: `POST /api/v3/contents/generations/tasks` answers `{"id"}`, `GET
…/tasks/{id}` says queued, running, succeeded (`content.video_url`, valid 24
h), failed (`error.code`), cancelled or expired, and `DELETE …/tasks/{id}`
cancels a queued task (a running one runs on; the vendor may bill it).
Authorization: `Bearer <api_key>`.

Faults: a moderation code (`InputTextSensitiveContentDetected`,
`Output*SensitiveContentDetected` with their `.PrivacyInformation` or
`.PolicyViolation` suffixes, `*RiskDetection`), in a 400 or a failed task,
is CONTENT_BLOCKED; other 4xx are UPSTREAM_FAILED; 429 (its
`RateLimitExceeded.*` family), 5xx and transport faults are retried.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Final
from urllib.parse import quote

from ...settings import UpstreamSettings
from .base import Output, Request, UpstreamError
from .fetch import decode_base64
from .http import Answer, UpstreamHttp, error_code, failed, http_fault
from .inputs import data_uri, int32_seed, nearest_ratio
from .tasks import Polled, TaskUpstream, VendorApi

IMAGES: Final = "/api/v3/images/generations"
TASKS: Final = "/api/v3/contents/generations/tasks"
RATIOS: Final = ("21:9", "16:9", "4:3", "1:1", "3:4", "9:16")
STATES: Final = {"queued": "waiting", "running": "running"}


def moderated(code: str) -> bool:
    """Tell whether an Ark error code is its content moderation's."""
    return "SensitiveContentDetected" in code or code.endswith("RiskDetection")


def refusal(code: str) -> UpstreamError:
    """The public error of an Ark refusal code."""
    return UpstreamError(
        "CONTENT_BLOCKED" if moderated(code) else "UPSTREAM_FAILED", transient=False
    )


def fault(answer: Answer) -> UpstreamError:
    """Map an Ark error answer: moderation, or the common mapping."""
    if answer.status == 400 and moderated(error_code(answer)):
        return refusal(error_code(answer))
    return http_fault(answer)


def image_body(request: Request) -> dict[str, Any]:
    """The Seedream request for one image."""
    body: dict[str, Any] = {
        "model": request.upstream_model,
        "prompt": request.prompt,
        "size": f"{request.width}x{request.height}",
        "seed": int32_seed(request.seed),
        "response_format": "b64_json",
        "sequential_image_generation": "disabled",
        "watermark": False,
    }
    if request.reference is not None:
        body["image"] = data_uri(request.reference)
    return body


def video_body(request: Request) -> dict[str, Any]:
    """The Seedance task for one clip."""
    content: list[dict[str, Any]] = [{"type": "text", "text": request.prompt}]
    ratio = nearest_ratio(request.width, request.height, RATIOS)
    if request.reference is not None:
        url = data_uri(request.reference)
        content.append(
            {"type": "image_url", "image_url": {"url": url}, "role": "first_frame"}
        )
        ratio = "adaptive"  # the clip takes the first frame's shape
    return {
        "model": request.upstream_model,
        "content": content,
        "resolution": "1080p" if min(request.width, request.height) >= 1080 else "720p",
        "ratio": ratio,
        "duration": round(request.seconds or 5),
        "seed": int32_seed(request.seed),
        "watermark": False,
    }


class ArkApi(VendorApi):
    """Seedream answered at once; Seedance created, polled and cancelled."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url, config.api_key, timeout=config.timeout
        )

    async def create(self, request: Request) -> str | list[Output]:
        """Make the images now, or create the video task."""
        if request.kind == "image":
            return list(
                await asyncio.gather(
                    *(self._image(request) for _ in range(request.count))
                )
            )
        answer = await self.http.call("POST", TASKS, json=video_body(request))
        if not answer.ok:
            raise fault(answer)
        body = answer.json()
        task = body.get("id") if isinstance(body, dict) else None
        if not isinstance(task, str) or not task:
            raise failed()
        return task

    async def _image(self, request: Request) -> Output:
        """One synchronous Seedream call, one image."""
        within = self.http.timeout * 2  # the answer comes when the image is made
        answer = await self.http.call(
            "POST", IMAGES, json=image_body(request), within=within
        )
        if not answer.ok:
            raise fault(answer)
        body = answer.json()
        if not isinstance(body, dict):
            raise failed()
        _raise_error(body.get("error"))
        data = body.get("data")
        if not isinstance(data, list) or not data or not isinstance(data[0], dict):
            raise failed()
        _raise_error(data[0].get("error"))
        return decode_base64(data[0].get("b64_json"), "image")

    async def poll(self, request: Request, task: str) -> Polled:
        """Read a Seedance task."""
        answer = await self.http.call("GET", f"{TASKS}/{quote(task, safe='')}")
        if not answer.ok:
            raise fault(answer)
        body = answer.json()
        if not isinstance(body, dict):
            raise failed()
        status = body.get("status")
        if status in STATES:
            return Polled(STATES[status])  # type: ignore[arg-type]
        if status == "succeeded":
            content = body.get("content")
            url = content.get("video_url") if isinstance(content, dict) else None
            if not isinstance(url, str):
                raise failed()
            return Polled("succeeded", results=(url,))
        if status == "failed":
            error = body.get("error")
            code = error.get("code") if isinstance(error, dict) else None
            return Polled("failed", code=refusal(str(code or "")).code)
        if status in ("cancelled", "expired"):
            return Polled("failed")
        raise failed()

    async def cancel(self, task: str) -> None:
        """Cancel a queued task (Ark runs a started one to its end)."""
        with contextlib.suppress(UpstreamError):
            await self.http.call("DELETE", f"{TASKS}/{quote(task, safe='')}")


def _raise_error(error: Any) -> None:
    """Raise the refusal an `error` object of an answer carries, if any."""
    if error is None:
        return
    code = error.get("code") if isinstance(error, dict) else None
    raise refusal(code if isinstance(code, str) else "")


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `ark` upstream: Ark's API in the shared task shape."""
    return TaskUpstream(ArkApi(config))
