"""The `replicate` protocol: Replicate's predictions (create, poll, cancel).

`POST {base_url}/v1/models/{owner}/{name}/predictions` runs an official model
(`owner/name:version` goes to `POST /v1/predictions` with its version);
Authorization: `Bearer <api_key>`. Images ask `Prefer: wait=N`, so a quick
model answers the finished prediction at once; videos (minutes) are polled
from the start: `GET /v1/predictions/{id}` says starting or processing (its
`logs` read for progress), then succeeded (`output`: a URL or a list of them,
downloaded through fetch.py, data: URIs decoded), failed (`error`) or
canceled. `POST /v1/predictions/{id}/cancel` when our task is cancelled.

Faults: a refusal whose text names the safety system (a 4xx `detail`, or a
failed prediction's `error`, e.g. "flagged as sensitive (E005)") is
CONTENT_BLOCKED; any other 4xx or failed prediction is UPSTREAM_FAILED at
once; 408/409/429 (honouring Retry-After), 5xx and transport faults are
transient. A create fault goes back to the worker, which retries with backoff;
once created, the prediction's id is kept with the job and polled (tasks.py),
so a retry, a re-delivery or a SIGKILLed worker never pays for two.

Each model's inputs live in MODELS, keyed by its Replicate id (the
`upstream_model` of content/models.toml); a model not listed gets GENERIC's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from ...content import Model
from ...settings import UpstreamSettings
from .base import Request, UpstreamError
from .http import FAILED, Answer, UpstreamHttp, failed, http_fault
from .inputs import data_uri, log_fraction, nearest_ratio, ratio, says_blocked
from .tasks import Polled, TaskUpstream, VendorApi

# Seconds an image's create may hold the line for the finished prediction.
WAIT_SECONDS: Final = 30
CANCEL_SECONDS: Final = 5.0
ACTIVE: Final = frozenset({"starting", "processing"})

Inputs = Callable[[Request], dict[str, Any]]


@dataclass(frozen=True, slots=True)
class ReplicateModel:
    """How one Replicate model takes our fields."""

    inputs: Inputs
    # The input a reference image goes in (None: the model takes none).
    reference_field: str | None = None
    negative_prompt: bool = False
    max_count: int = 1
    durations: tuple[int, ...] | None = None
    # Sizes it makes only from a reference (whose shape the clip then takes).
    needs_reference: frozenset[str] = frozenset()


def _hailuo(request: Request) -> dict[str, Any]:
    # Text-to-video is 16:9; 768p is the tier nearest our 1280x720 (10 s needs it).
    return {"duration": _seconds(request), "resolution": "768p"}


_KONTEXT_RATIOS: Final = ("21:9", "16:9", "4:3", "3:2", "1:1", "2:3", "3:4", "9:16")


def _kontext(request: Request) -> dict[str, Any]:
    shape = nearest_ratio(request.width, request.height, _KONTEXT_RATIOS)
    return {
        "aspect_ratio": "match_input_image" if request.reference else shape,
        "seed": request.seed,
        "output_format": "png",
        "safety_tolerance": 2,
    }


def _generic(request: Request) -> dict[str, Any]:
    inputs: dict[str, Any] = {
        "aspect_ratio": ratio(request.width, request.height),
        "seed": request.seed,
    }
    if request.kind == "video":
        inputs["duration"] = _seconds(request)
    else:
        inputs["num_outputs"] = request.count
    return inputs


MODELS: Final[dict[str, ReplicateModel]] = {
    "minimax/hailuo-02": ReplicateModel(
        _hailuo,
        reference_field="first_frame_image",
        durations=(6, 10),
        needs_reference=frozenset({"720x1280"}),
    ),
    "black-forest-labs/flux-kontext-pro": ReplicateModel(
        _kontext, reference_field="input_image"
    ),
}
GENERIC: Final = ReplicateModel(
    _generic, reference_field="image", negative_prompt=True, max_count=4
)


def _model(upstream_model: str) -> ReplicateModel:
    return MODELS.get(upstream_model.partition(":")[0], GENERIC)


def _seconds(request: Request) -> int:
    """The clip length the catalog row asks for, if the model makes it."""
    seconds = round(request.seconds or 5)
    durations = _model(request.upstream_model).durations
    if durations is not None and seconds not in durations:
        raise failed()  # a catalog row the model cannot honour (a test checks each)
    return seconds


def refused_field(model: Model, asked: Mapping[str, Any]) -> str | None:
    """Name the first field of a submit this model on Replicate cannot take."""
    replicate = _model(model.upstream_model)
    negative = asked.get("negative_prompt", "")
    if isinstance(negative, str) and negative.strip() and not replicate.negative_prompt:
        return "negative_prompt"
    count = asked.get("count", 1)
    if isinstance(count, int) and count > replicate.max_count:
        return "count"
    if "reference" in asked and replicate.reference_field is None:
        return "reference"
    size = asked.get("size", model.sizes[0])
    if "reference" not in asked and size in replicate.needs_reference:
        return "size"  # this shape comes only from a reference image
    return None


def request_of(request: Request) -> tuple[str, dict[str, Any]]:
    """The create path and body for one generation."""
    replicate = _model(request.upstream_model)
    inputs: dict[str, Any] = {"prompt": request.prompt, **replicate.inputs(request)}
    if request.negative_prompt and replicate.negative_prompt:
        inputs["negative_prompt"] = request.negative_prompt
    if request.reference is not None:
        if replicate.reference_field is None:
            raise failed()  # submit refuses this; a changed catalog row may not
        inputs[replicate.reference_field] = data_uri(request.reference)
    name, _, version = request.upstream_model.partition(":")
    owner, _, model = name.partition("/")
    if not owner or not model or "/" in model:
        raise failed()  # not a Replicate model id
    if version:
        return "/v1/predictions", {"version": version, "input": inputs}
    path = f"/v1/models/{quote(owner, safe='')}/{quote(model, safe='')}/predictions"
    return path, {"input": inputs}


def fault(answer: Answer) -> UpstreamError:
    """Map an error answer: the safety system, or the common mapping."""
    if 400 <= answer.status < 500 and answer.status not in (408, 409, 429):
        with contextlib.suppress(UpstreamError):
            body = answer.json()
            if isinstance(body, dict) and says_blocked(
                [body.get("detail"), body.get("title"), body.get("error")]
            ):
                return UpstreamError("CONTENT_BLOCKED", transient=False)
    return http_fault(answer)


class ReplicateApi(VendorApi):
    """Replicate predictions in the shared task shape (tasks.py)."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url, config.api_key, scheme="Bearer", timeout=config.timeout
        )

    async def create(self, request: Request) -> str | Polled:
        """Create the prediction; an image may come back finished (Prefer: wait)."""
        path, body = request_of(request)
        headers, within = {}, None
        if request.kind == "image":
            headers["Prefer"] = f"wait={WAIT_SECONDS}"
            within = self.http.timeout + WAIT_SECONDS
        answer = await self.http.call(
            "POST", path, json=body, headers=headers, within=within
        )
        if not answer.ok:
            raise fault(answer)
        prediction = _prediction(answer.json())
        if prediction["status"] in ACTIVE:
            return str(prediction["id"])
        return _read(prediction)

    async def poll(self, request: Request, task: str) -> Polled:
        """Read the prediction."""
        answer = await self.http.call("GET", _path(task))
        if not answer.ok:
            raise fault(answer)
        return _read(_prediction(answer.json()))

    async def cancel(self, task: str) -> None:
        """Ask Replicate to stop the prediction."""
        with contextlib.suppress(UpstreamError):
            await self.http.call("POST", _path(task) + "/cancel", within=CANCEL_SECONDS)


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `replicate` upstream: predictions in the shared task shape."""
    return TaskUpstream(ReplicateApi(config))


def _path(task: str) -> str:
    return f"/v1/predictions/{quote(task, safe='')}"


def _read(prediction: dict[str, Any]) -> Polled:
    """A prediction in our terms: its state, progress from its logs, its output."""
    status = prediction["status"]
    if status == "starting":
        return Polled("waiting")
    if status == "processing":
        logs = prediction.get("logs")
        lines = logs.splitlines() if isinstance(logs, str) else []
        return Polled("running", log_fraction(lines))
    if status == "failed":
        blocked = says_blocked([prediction.get("error")])
        return Polled("failed", code="CONTENT_BLOCKED" if blocked else FAILED)
    if status != "succeeded":
        return Polled("failed")  # canceled (or aborted) by someone else
    output = prediction.get("output")
    urls = [output] if isinstance(output, str) else output
    if not isinstance(urls, list) or not all(isinstance(url, str) for url in urls):
        raise failed()
    return Polled("succeeded", results=tuple(urls))


def _prediction(body: Any) -> dict[str, Any]:
    """A prediction object: a dict with a string id and status, or a failure."""
    if not isinstance(body, dict):
        raise failed()
    if not isinstance(body.get("id"), str) or not body["id"]:
        raise failed()
    if not isinstance(body.get("status"), str):
        raise failed()
    return body
