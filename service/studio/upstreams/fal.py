"""The `fal` protocol: fal's queue API (submit, status, result, cancel).

`POST {base_url}/{endpoint}` (Authorization: `Key <api_key>`) queues a request
and answers its request_id and the URLs of its status, response and cancel;
`GET …/status?logs=1` says IN_QUEUE (with queue_position), IN_PROGRESS (with
the runner's logs, read for progress) or COMPLETED; `GET …/requests/{id}` is
the result (`images[].url` or `video.url`), downloaded through fetch.py; `PUT
…/cancel` when our task is cancelled. Those URLs are used only when they are
on base_url's origin (the key goes nowhere else); otherwise they are rebuilt
from the endpoint's app id (its first two path segments, as fal does).

Faults: a refusal of the content checker (HTTP 422 whose `detail` has type
`content_policy_violation`, or a COMPLETED status with that `error_type`, or an
image flagged `has_nsfw_concepts`) is CONTENT_BLOCKED; any other 4xx is
UPSTREAM_FAILED at once; 408/409/429 (honouring Retry-After), 5xx and
transport faults are transient. A submit fault goes back to the worker, which
retries with backoff; once a request is queued, its URLs are kept with the job
and polled (tasks.py), so one generation never pays for two fal requests, even
across a retry, a re-delivery or a SIGKILLed worker.

Each model's fields live in MODELS, keyed by its fal endpoint (the
`upstream_model` of content/models.toml): which endpoint takes a reference
image, and how our size, count, seed, seconds and negative prompt map onto
its inputs. A model not listed gets the common fal inputs (GENERIC).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from ...content import Model
from ...settings import UpstreamSettings
from .base import Request, UpstreamError
from .http import FAILED, Answer, UpstreamHttp, failed, http_fault
from .inputs import data_uri, log_fraction, nearest_ratio, says_blocked
from .tasks import Polled, TaskUpstream, VendorApi

# How long a cancel may take when the task is already being cancelled.
CANCEL_SECONDS: Final = 5.0
BLOCKED_TYPE: Final = "content_policy_violation"

Inputs = Callable[[Request], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class FalModel:
    """How one fal model takes our fields."""

    inputs: Inputs
    # The endpoint that takes a reference image, and the field it goes in.
    with_reference: str | None = None
    reference_field: str = "image_url"
    negative_prompt: bool = False
    # Clip lengths (seconds) the model makes; None: any (or not a video model).
    durations: tuple[int, ...] | None = None


def _seedream(request: Request) -> dict[str, Any]:
    # Any size from 1024 to 4096 a side; max_images 1: exactly num_images images.
    return {
        "image_size": {"width": request.width, "height": request.height},
        "num_images": request.count,
        "max_images": 1,
        "seed": request.seed,
        "enable_safety_checker": True,
    }


_KONTEXT_RATIOS: Final = ("21:9", "16:9", "4:3", "3:2", "1:1", "2:3", "3:4", "9:16")


def _kontext(request: Request) -> dict[str, Any]:
    return {
        "aspect_ratio": nearest_ratio(request.width, request.height, _KONTEXT_RATIOS),
        "num_images": request.count,
        "seed": request.seed,
        "output_format": "png",
        "safety_tolerance": "2",
    }


def _kling(request: Request) -> dict[str, Any]:
    # Kling takes no seed; image-to-video takes its shape from the image.
    inputs: dict[str, Any] = {"duration": str(_seconds(request))}
    if request.reference is None:
        inputs["aspect_ratio"] = nearest_ratio(
            request.width, request.height, ("16:9", "9:16", "1:1")
        )
    return inputs


def _veo(request: Request) -> dict[str, Any]:
    return {
        "aspect_ratio": nearest_ratio(request.width, request.height, ("16:9", "9:16")),
        "duration": f"{_seconds(request)}s",
        "resolution": "720p",
        "generate_audio": True,
        "seed": request.seed,
    }


def _generic(request: Request) -> dict[str, Any]:
    if request.kind == "video":
        return {
            "duration": str(_seconds(request)),
            "aspect_ratio": nearest_ratio(
                request.width, request.height, ("16:9", "9:16", "1:1")
            ),
            "seed": request.seed,
        }
    return {
        "image_size": {"width": request.width, "height": request.height},
        "num_images": request.count,
        "seed": request.seed,
    }


MODELS: Final[dict[str, FalModel]] = {
    "fal-ai/bytedance/seedream/v4/text-to-image": FalModel(
        _seedream,
        with_reference="fal-ai/bytedance/seedream/v4/edit",
        reference_field="image_urls",
    ),
    "fal-ai/flux-pro/kontext/text-to-image": FalModel(
        _kontext, with_reference="fal-ai/flux-pro/kontext"
    ),
    "fal-ai/kling-video/v2.1/master/text-to-video": FalModel(
        _kling,
        with_reference="fal-ai/kling-video/v2.1/master/image-to-video",
        negative_prompt=True,
        durations=(5, 10),
    ),
    "fal-ai/veo3/fast": FalModel(_veo, negative_prompt=True, durations=(4, 6, 8)),
}


def _model(upstream_model: str) -> FalModel:
    found = MODELS.get(upstream_model)
    if found is not None:
        return found
    return FalModel(_generic, with_reference=upstream_model, negative_prompt=True)


def refused_field(model: Model, asked: Mapping[str, Any]) -> str | None:
    """Name the first field of a submit this model's fal endpoint cannot take."""
    fal = _model(model.upstream_model)
    negative = asked.get("negative_prompt", "")
    if isinstance(negative, str) and negative.strip() and not fal.negative_prompt:
        return "negative_prompt"
    if "reference" in asked and fal.with_reference is None:
        return "reference"
    return None


def _seconds(request: Request) -> int:
    """The clip length the catalog row asks for, if the model makes it."""
    seconds = round(request.seconds or 5)
    durations = _model(request.upstream_model).durations
    if durations is not None and seconds not in durations:
        raise failed()  # a catalog row the model cannot honour (a test checks each)
    return seconds


def request_of(request: Request) -> tuple[str, dict[str, Any]]:
    """The fal endpoint and the input body for one generation."""
    fal = _model(request.upstream_model)
    body: dict[str, Any] = {"prompt": request.prompt, **fal.inputs(request)}
    if request.negative_prompt and fal.negative_prompt:
        body["negative_prompt"] = request.negative_prompt
    endpoint = request.upstream_model
    if request.reference is not None:
        if fal.with_reference is None:
            raise failed()  # submit refuses this; a changed catalog row may not
        endpoint = fal.with_reference
        uri = data_uri(request.reference)
        field_value: Any = [uri] if fal.reference_field.endswith("s") else uri
        body[fal.reference_field] = field_value
    return endpoint, body


def blocked(body: Any) -> bool:
    """Tell whether a fal error body is its content checker's refusal."""
    if not isinstance(body, dict):
        return False
    if body.get("error_type") == BLOCKED_TYPE:
        return True
    detail = body.get("detail")
    if isinstance(detail, str):  # endpoints not yet on typed errors say it in words
        return says_blocked(detail)
    items = detail if isinstance(detail, list) else [detail]
    return any(isinstance(i, dict) and i.get("type") == BLOCKED_TYPE for i in items)


def fault(answer: Answer) -> UpstreamError:
    """Map a fal error answer: the content checker, or the common mapping."""
    if 400 <= answer.status < 500 and answer.status not in (408, 409, 429):
        with contextlib.suppress(UpstreamError):
            if blocked(answer.json()):
                return UpstreamError("CONTENT_BLOCKED", transient=False)
    return http_fault(answer)


@dataclass(frozen=True, slots=True)
class Queued:
    """Where one queued request is followed."""

    status: str
    response: str
    cancel: str


class FalApi(VendorApi):
    """fal's queue in the shared task shape (tasks.py); the task is its URLs."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url, config.api_key, scheme="Key", timeout=config.timeout
        )

    async def create(self, request: Request) -> str:
        """Queue the request; the job keeps where it is followed (its URLs)."""
        endpoint, body = request_of(request)
        answer = await self.http.call("POST", "/" + endpoint, json=body)
        if not answer.ok:
            raise fault(answer)
        return json.dumps(dataclasses.asdict(self._queued(endpoint, answer.json())))

    def _queued(self, endpoint: str, submitted: Any) -> Queued:
        """Read the submit answer; keep its URLs only on the upstream's origin."""
        if not isinstance(submitted, dict):
            raise failed()
        request_id = submitted.get("request_id")
        if not isinstance(request_id, str) or not request_id:
            raise failed()
        app = "/".join(endpoint.split("/")[:2])
        base = f"{self.http.base_url}/{app}/requests/{quote(request_id, safe='')}"

        def own(name: str, fallback: str) -> str:
            url = submitted.get(name)
            ok = isinstance(url, str) and self.http.same_origin(url)
            return url if ok else fallback  # type: ignore[return-value]

        return Queued(
            own("status_url", base + "/status"),
            own("response_url", base),
            own("cancel_url", base + "/cancel"),
        )

    async def poll(self, request: Request, task: str) -> Polled:
        """Read the status; once COMPLETED, the result's files."""
        queued = _task(task)
        separator = "&" if "?" in queued.status else "?"
        answer = await self.http.call("GET", queued.status + separator + "logs=1")
        if not answer.ok:
            raise fault(answer)
        status = answer.json()
        if not isinstance(status, dict):
            raise failed()
        state = status.get("status")
        if state == "IN_QUEUE":
            return Polled("waiting")
        if state == "IN_PROGRESS":
            return Polled("running", log_fraction(_messages(status)))
        if state != "COMPLETED":
            raise failed()
        if status.get("error") or status.get("error_type"):
            return Polled(
                "failed", code="CONTENT_BLOCKED" if blocked(status) else FAILED
            )
        answer = await self.http.call("GET", queued.response)
        if not answer.ok:
            raise fault(answer)
        return _result(answer.json(), request)

    async def cancel(self, task: str) -> None:
        """Ask fal to drop the request."""
        with contextlib.suppress(UpstreamError):
            await self.http.call("PUT", _task(task).cancel, within=CANCEL_SECONDS)


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `fal` upstream: fal's queue in the shared task shape."""
    return TaskUpstream(FalApi(config))


def _task(task: str) -> Queued:
    """The URLs a kept task names (only ever written by `create`)."""
    try:
        return Queued(**json.loads(task))
    except (TypeError, ValueError):
        raise failed() from None


def _result(result: Any, request: Request) -> Polled:
    """The files of a result: the images paid for (none flagged), or the video."""
    if not isinstance(result, dict):
        raise failed()
    if request.kind == "video":
        video = result.get("video")
        if not isinstance(video, dict) or not isinstance(video.get("url"), str):
            raise failed()
        return Polled("succeeded", results=(video["url"],))
    images = result.get("images")
    if not isinstance(images, list) or len(images) < request.count:
        raise failed()
    flagged = result.get("has_nsfw_concepts")
    if isinstance(flagged, list) and any(flagged[: request.count]):
        return Polled("failed", code="CONTENT_BLOCKED")
    urls = []
    for image in images[: request.count]:
        if not isinstance(image, dict) or not isinstance(image.get("url"), str):
            raise failed()
        urls.append(image["url"])
    return Polled("succeeded", results=tuple(urls))


def _messages(status: Mapping[str, Any]) -> list[str]:
    logs = status.get("logs")
    if not isinstance(logs, list):
        return []
    return [
        entry["message"]
        for entry in logs
        if isinstance(entry, dict) and isinstance(entry.get("message"), str)
    ]
