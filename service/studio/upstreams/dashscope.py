"""The `dashscope` protocol: Alibaba Model Studio's Wan video tasks and Qwen-Image.

Videos are tasks: `POST /api/v1/services/aigc/video-generation/video-synthesis`
with the mandatory `X-DashScope-Async: enable` answers `output.task_id`;
`GET /api/v1/tasks/{id}` says PENDING, RUNNING, SUCCEEDED (`output.video_url`,
valid 24 h), FAILED (`output.code`), CANCELED or UNKNOWN (expired); `POST
/api/v1/tasks/{id}/cancel` cancels a PENDING task (a running one runs on and
may be billed). A reference image makes the model's image-to-video sibling
(`…-t2v` → `…-i2v`) take it as its first frame. Qwen-Image is synchronous:
`POST /api/v1/services/aigc/multimodal-generation/generation` answers the
images' URLs in `output.choices[0].message.content[].image`.
Authorization: `Bearer <api_key>`.

Faults (`{"code", "message"}` with the HTTP status, or a failed task's
`output.code`): `DataInspectionFailed` and `IPInfringementSuspect` are
CONTENT_BLOCKED; `Throttling*` (429), 5xx and transport faults are retried;
other refusals are UPSTREAM_FAILED.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final
from urllib.parse import quote

from ...settings import UpstreamSettings
from .base import Output, Request, UpstreamError
from .fetch import fetch_result
from .http import Answer, UpstreamHttp, error_code, failed, http_fault, retry_after
from .inputs import data_uri, int32_seed, nearest_ratio
from .tasks import Polled, TaskUpstream, VendorApi

VIDEO: Final = "/api/v1/services/aigc/video-generation/video-synthesis"
IMAGES: Final = "/api/v1/services/aigc/multimodal-generation/generation"
TASKS: Final = "/api/v1/tasks"
ASYNC: Final = {"X-DashScope-Async": "enable"}
BLOCKED: Final = frozenset({"DataInspectionFailed", "IPInfringementSuspect"})
RATIOS: Final = ("16:9", "9:16", "1:1", "4:3", "3:4")
STATES: Final = {"PENDING": "waiting", "SUSPENDED": "waiting", "RUNNING": "running"}


def refusal(code: str) -> UpstreamError:
    """The public error of a DashScope refusal code."""
    blocked = code in BLOCKED
    return UpstreamError(
        "CONTENT_BLOCKED" if blocked else "UPSTREAM_FAILED", transient=False
    )


def fault(answer: Answer) -> UpstreamError:
    """Map a DashScope error answer: moderation, throttling, or the common way."""
    code = error_code(answer)
    if code in BLOCKED:
        return refusal(code)
    if code.startswith("Throttling"):
        return failed(transient=True, retry_after=retry_after(answer.headers))
    return http_fault(answer)


def video_body(request: Request) -> dict[str, Any]:
    """The Wan task for one clip (the new protocol of wan2.7 and later)."""
    inputs: dict[str, Any] = {"prompt": request.prompt}
    if request.negative_prompt:
        inputs["negative_prompt"] = request.negative_prompt
    parameters: dict[str, Any] = {
        "resolution": "1080P" if min(request.width, request.height) >= 1080 else "720P",
        "duration": round(request.seconds or 5),
        "prompt_extend": False,
        "watermark": False,
        "seed": int32_seed(request.seed),
    }
    model = request.upstream_model
    if request.reference is None:
        parameters["ratio"] = nearest_ratio(request.width, request.height, RATIOS)
    else:
        model = model.replace("-t2v", "-i2v")
        inputs["media"] = [{"type": "first_frame", "url": data_uri(request.reference)}]
    return {"model": model, "input": inputs, "parameters": parameters}


def image_body(request: Request) -> dict[str, Any]:
    """The Qwen-Image request for all the images at once."""
    content: list[dict[str, str]] = [{"text": request.prompt}]
    if request.reference is not None:
        content.append({"image": data_uri(request.reference)})
    parameters: dict[str, Any] = {
        "size": f"{request.width}*{request.height}",
        "n": request.count,
        "seed": int32_seed(request.seed),
        "prompt_extend": False,
        "watermark": False,
    }
    if request.negative_prompt:
        parameters["negative_prompt"] = request.negative_prompt
    return {
        "model": request.upstream_model,
        "input": {"messages": [{"role": "user", "content": content}]},
        "parameters": parameters,
    }


class DashScopeApi(VendorApi):
    """Qwen-Image answered at once; Wan videos created, polled and cancelled."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url, config.api_key, timeout=config.timeout
        )

    async def create(self, request: Request) -> str | list[Output]:
        """Make the images now, or create the video task."""
        if request.kind == "image":
            return await self._images(request)
        answer = await self.http.call(
            "POST", VIDEO, json=video_body(request), headers=ASYNC
        )
        if not answer.ok:
            raise fault(answer)
        output = _output(answer.json())
        task = output.get("task_id")
        if not isinstance(task, str) or not task:
            raise failed()
        return task

    async def _images(self, request: Request) -> list[Output]:
        """One synchronous Qwen-Image call; its URLs downloaded at once."""
        answer = await self.http.call(
            "POST", IMAGES, json=image_body(request), within=self.http.timeout * 2
        )
        if not answer.ok:
            raise fault(answer)
        output = _output(answer.json())
        urls = []
        with contextlib.suppress(AttributeError, IndexError, KeyError, TypeError):
            content = output["choices"][0]["message"]["content"]
            urls = [item["image"] for item in content if "image" in item]
        if len(urls) < request.count or not all(isinstance(u, str) for u in urls):
            raise failed()
        return [
            await fetch_result(self.http, url, "image") for url in urls[: request.count]
        ]

    async def poll(self, request: Request, task: str) -> Polled:
        """Read a task."""
        answer = await self.http.call("GET", f"{TASKS}/{quote(task, safe='')}")
        if not answer.ok:
            raise fault(answer)
        output = _output(answer.json())
        status = output.get("task_status")
        if status in STATES:
            return Polled(STATES[status])  # type: ignore[arg-type]
        if status == "SUCCEEDED":
            url = output.get("video_url")
            if not isinstance(url, str):
                raise failed()
            return Polled("succeeded", results=(url,))
        if status == "FAILED":
            code = output.get("code")
            return Polled("failed", code=refusal(str(code or "")).code)
        if status in ("CANCELED", "UNKNOWN"):
            return Polled("failed")
        raise failed()

    async def cancel(self, task: str) -> None:
        """Cancel a PENDING task (DashScope runs a started one to its end)."""
        with contextlib.suppress(UpstreamError):
            await self.http.call("POST", f"{TASKS}/{quote(task, safe='')}/cancel")


def _output(body: Any) -> dict[str, Any]:
    """The `output` object of an answer, or a failure."""
    output = body.get("output") if isinstance(body, dict) else None
    if not isinstance(output, dict):
        raise failed()
    return output


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `dashscope` upstream: DashScope's API in the shared task shape."""
    return TaskUpstream(DashScopeApi(config))
