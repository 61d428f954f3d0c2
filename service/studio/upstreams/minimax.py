"""The `minimax` protocol: MiniMax's Hailuo video tasks and `image-01`.

Videos: `POST /v1/video_generation` answers `task_id`; `GET
/v1/query/video_generation?task_id=` says Preparing, Queueing, Processing,
Success (with a `file_id`) or Fail; then `GET /v1/files/retrieve?file_id=`
gives `file.download_url` (time-limited), downloaded at once. Images:
`POST /v1/image_generation` with `response_format: base64` answers
`data.image_base64[]` at once. Authorization: `Bearer <api_key>`. The V1 API
has no cancel: a canceled job is abandoned and refunded, MiniMax may bill it.

Errors mostly arrive with HTTP 200, in `base_resp.status_code` (0: success):
1026 (input) and 1027 (output) sensitive content are CONTENT_BLOCKED; 1002
(rate limit), 1000, 1001, 1024 and 1033 (unknown, timeout, internal,
downstream) are retried; the rest (auth 1004, balance 1008, parameters 2013…)
are UPSTREAM_FAILED at once. A task that reports Fail is over whatever its
code (but 1026/1027, CONTENT_BLOCKED). HTTP faults map the common way.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import quote

from ...settings import UpstreamSettings
from .base import Output, Request, UpstreamError
from .fetch import decode_base64
from .http import UpstreamHttp, failed, http_fault
from .inputs import data_uri, int32_seed, nearest_ratio
from .tasks import Polled, TaskUpstream, VendorApi

VIDEO: Final = "/v1/video_generation"
QUERY: Final = "/v1/query/video_generation"
FILES: Final = "/v1/files/retrieve"
IMAGES: Final = "/v1/image_generation"
BLOCKED: Final = frozenset({1026, 1027})
RETRIED: Final = frozenset({1000, 1001, 1002, 1024, 1033})
STATES: Final = {"Preparing": "waiting", "Queueing": "waiting", "Processing": "running"}


def status_code(body: dict[str, Any]) -> int:
    """`base_resp.status_code` of an answer (a missing one is a failure)."""
    base = body.get("base_resp")
    code = base.get("status_code") if isinstance(base, dict) else None
    if not isinstance(code, int) or isinstance(code, bool):
        raise failed()
    return code


def refusal(code: int) -> UpstreamError:
    """The public error of a nonzero status code."""
    if code in BLOCKED:
        return UpstreamError("CONTENT_BLOCKED", transient=False)
    return failed(transient=code in RETRIED)


class MiniMaxApi(VendorApi):
    """Hailuo tasks created, queried and retrieved; image-01 answered at once."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url, config.api_key, timeout=config.timeout
        )

    async def _answer(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        """One call's JSON object, whatever its status_code says."""
        answer = await self.http.call(method, path, **options)
        if not answer.ok:
            raise http_fault(answer)
        body = answer.json()
        if not isinstance(body, dict):
            raise failed()
        return body

    async def _call(self, method: str, path: str, **options: Any) -> dict[str, Any]:
        """One call whose answer must say status_code 0 (errors come with 200)."""
        body = await self._answer(method, path, **options)
        code = status_code(body)
        if code != 0:
            raise refusal(code)
        return body

    async def create(self, request: Request) -> str | list[Output]:
        """Make the images now, or create the video task."""
        if request.kind == "image":
            return await self._images(request)
        body: dict[str, Any] = {
            "model": request.upstream_model,
            "prompt": request.prompt,
            "duration": round(request.seconds or 6),
            "resolution": "1080P"
            if min(request.width, request.height) >= 1080
            else "768P",
            "prompt_optimizer": False,
        }
        if request.reference is not None:
            body["first_frame_image"] = data_uri(request.reference)
        answer = await self._call("POST", VIDEO, json=body)
        task = answer.get("task_id")
        if not isinstance(task, str) or not task:
            raise failed()
        return task

    async def _images(self, request: Request) -> list[Output]:
        """image-01: all the images in one synchronous call, as base64."""
        body: dict[str, Any] = {
            "model": request.upstream_model,
            "prompt": request.prompt,
            "aspect_ratio": nearest_ratio(
                request.width, request.height,
                ("1:1", "16:9", "4:3", "3:2", "2:3", "3:4", "9:16", "21:9"),
            ),
            "response_format": "base64",
            "seed": int32_seed(request.seed),
            "n": request.count,
            "prompt_optimizer": False,
        }  # fmt: skip
        answer = await self._call(
            "POST", IMAGES, json=body, within=self.http.timeout * 2
        )
        data = answer.get("data")
        images = data.get("image_base64") if isinstance(data, dict) else None
        if not isinstance(images, list) or len(images) < request.count:
            raise failed()
        return [decode_base64(image, "image") for image in images[: request.count]]

    async def poll(self, request: Request, task: str) -> Polled:
        """Query the task; on Success, retrieve its file's download URL."""
        body = await self._answer("GET", f"{QUERY}?task_id={quote(task, safe='')}")
        status, code = body.get("status"), status_code(body)
        if status == "Fail":
            # Final whatever its code: a retryable one (1024, internal) says why
            # the task failed, not that asking again could revive it.
            if code in BLOCKED:
                raise refusal(code)
            return Polled("failed")
        if code != 0:
            raise refusal(code)  # the query itself: a rate limit is asked again
        if status in STATES:
            return Polled(STATES[status])  # type: ignore[arg-type]
        if status != "Success":
            raise failed()
        file_id = body.get("file_id")
        if not isinstance(file_id, (str, int)) or isinstance(file_id, bool):
            raise failed()
        retrieved = await self._call("GET", f"{FILES}?file_id={quote(str(file_id))}")
        file = retrieved.get("file")
        url = file.get("download_url") if isinstance(file, dict) else None
        if not isinstance(url, str):
            raise failed()
        return Polled("succeeded", results=(url,))

    async def cancel(self, task: str) -> None:
        """Nothing to call: MiniMax's V1 API cannot cancel (it may still bill)."""


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `minimax` upstream: MiniMax's API in the shared task shape."""
    return TaskUpstream(MiniMaxApi(config))
