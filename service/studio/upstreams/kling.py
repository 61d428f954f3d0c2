"""The `kling` protocol: the Kling open platform's video and image tasks.

The key is `ACCESS_KEY:SECRET_KEY`; each request carries a fresh HS256 JWT
(`iss` the access key, `exp` now + 30 min, `nbf` now − 5 s) signed with the
secret key, as `Authorization: Bearer <jwt>`. `POST /v1/videos/text2video`
(or `/v1/videos/image2video` with a reference, as bare base64) and `POST
/v1/images/generations` answer `data.task_id`; `GET` the same path `/{id}`
says submitted, processing, succeed (`task_result.videos[].url` or
`.images[].url`) or failed (`task_status_msg`). Kling has no cancel: a
canceled job is abandoned and refunded, and Kling may still bill the task.

Faults (`{"code", "message"}` with the HTTP status): 1301 (the content
security policy, also a failed task whose message says so) is
CONTENT_BLOCKED; 1302 (rate) and 1303 (the resource pack's concurrency) are
retried, as are 5000–5002, 5xx and transport faults; the rest (auth 1000–1004,
account 1100–1103, parameters 1200–1203) are UPSTREAM_FAILED at once. A
concurrency of N is kept across the fleet by `max_in_flight = N`.
"""

from __future__ import annotations

import base64
import io
import math
import re
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import quote

from ...content import Model
from ...settings import UpstreamSettings
from .base import Output, Request, UpstreamError
from .http import Answer, Secret, UpstreamHttp, failed, http_fault, retry_after
from .inputs import nearest_ratio, says_blocked
from .tasks import Polled, TaskUpstream, VendorApi

TEXT2VIDEO: Final = "videos/text2video"
IMAGE2VIDEO: Final = "videos/image2video"
IMAGES: Final = "images/generations"
PATHS: Final = frozenset({TEXT2VIDEO, IMAGE2VIDEO, IMAGES})
# Kling reads a reference as a JPEG or PNG of at least 300 px a side.
REFERENCE_FORMATS: Final = frozenset({"JPEG", "PNG"})
REFERENCE_MIN_SIDE: Final = 300
TOKEN_SECONDS: Final = 1800
BLOCKED: Final = 1301
RETRIED: Final = frozenset({1302, 1303, 5000, 5001, 5002})
STATES: Final = {"submitted": "waiting", "processing": "running"}
# A failed task's message when the platform's content check refused it.
_RISK: Final = re.compile(r"风控|内容安全|敏感|违规|risk control|security polic", re.I)


class KlingToken:
    """Mints the JWT Kling asks of every request; the secret shows nowhere else."""

    def __init__(self, api_key: str) -> None:
        access, _, secret = api_key.partition(":")
        self._access = access
        self._secret = Secret(secret)

    def __repr__(self) -> str:
        return "KlingToken('***')"

    def __call__(self) -> str:
        import jwt  # here: only a process that calls Kling loads it

        now = int(time.time())
        claims = {"iss": self._access, "exp": now + TOKEN_SECONDS, "nbf": now - 5}
        return jwt.encode(
            claims, self._secret.reveal(), algorithm="HS256", headers={"typ": "JWT"}
        )


def code_of(body: Any) -> int | None:
    """Kling's numeric `code` of an answer (0: success)."""
    code = body.get("code") if isinstance(body, dict) else None
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def fault(answer: Answer) -> UpstreamError:
    """Map a Kling error answer by its code, then the common way."""
    try:
        code = code_of(answer.json())
    except UpstreamError:
        code = None
    if code == BLOCKED:
        return UpstreamError("CONTENT_BLOCKED", transient=False)
    if code in RETRIED:
        return failed(transient=True, retry_after=retry_after(answer.headers))
    if code is not None and answer.status == 429:
        return failed()  # an account's arrears or an empty pack: no retry helps
    return http_fault(answer)


# Kling's reference aspect: width / height from 1:2.5 to 2.5:1.
REFERENCE_RATIO: Final = 2.5


def refused_field(model: Model, asked: Mapping[str, Any]) -> str | None:
    """Name a field of a submit Kling cannot take: a seed, or a reference too
    long or too tall for it (`reference_size`, the upload's, given by submit)."""
    if "seed" in asked:
        return "seed"
    size = asked.get("reference_size")
    if size is not None:
        width, height = size
        if not 1 / REFERENCE_RATIO <= width / height <= REFERENCE_RATIO:
            return "reference"
    return None


def reference_image(data: bytes) -> str:
    """A reference as Kling takes it: bare base64 of a JPEG or PNG at least 300
    px a side. Another upload (a WebP) or a smaller one is sent as a PNG, scaled
    up to 300 px on its short side."""
    from PIL import Image  # a worker's, when it builds a body: not serve's

    with Image.open(io.BytesIO(data)) as image:
        short = min(image.size)
        if image.format in REFERENCE_FORMATS and short >= REFERENCE_MIN_SIDE:
            return base64.b64encode(data).decode()
        alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
        picture = image.convert("RGBA" if alpha else "RGB")
    if short < REFERENCE_MIN_SIDE:
        scale = REFERENCE_MIN_SIDE / short
        size = (math.ceil(picture.width * scale), math.ceil(picture.height * scale))
        picture = picture.resize(size, Image.Resampling.LANCZOS)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG", compress_level=1)  # only Kling reads it
    return base64.b64encode(buffer.getvalue()).decode()


def create_of(request: Request) -> tuple[str, dict[str, Any]]:
    """The create path (under /v1/) and body for one generation."""
    body: dict[str, Any] = {
        "model_name": request.upstream_model,
        "prompt": request.prompt,
    }
    if request.negative_prompt:
        body["negative_prompt"] = request.negative_prompt
    if request.kind == "image":
        body |= {
            "n": request.count,
            "aspect_ratio": nearest_ratio(
                request.width, request.height, ("1:1", "16:9", "9:16", "4:3", "3:4")
            ),
        }
        if request.reference is not None:
            body["image"] = reference_image(request.reference)
        return IMAGES, body
    body |= {"mode": "std", "duration": str(round(request.seconds or 5))}
    if request.reference is not None:
        body["image"] = reference_image(request.reference)  # bare base64
        return IMAGE2VIDEO, body
    body["aspect_ratio"] = nearest_ratio(
        request.width, request.height, ("16:9", "9:16", "1:1")
    )
    return TEXT2VIDEO, body


class KlingApi(VendorApi):
    """Kling tasks created and polled (no cancel: Kling has none)."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(
            config.base_url,
            "",
            timeout=config.timeout,
            token=KlingToken(config.api_key),
        )

    async def create(self, request: Request) -> str | list[Output]:
        """Create the task; the memo keeps `<path>/<task id>`."""
        path, body = create_of(request)
        answer = await self.http.call("POST", f"/v1/{path}", json=body)
        if not answer.ok:
            raise fault(answer)
        data = _data(answer.json())
        task = data.get("task_id")
        if not isinstance(task, str) or not task:
            raise failed()
        return f"{path}/{task}"

    async def poll(self, request: Request, task: str) -> Polled:
        """Read a task."""
        path, _, task_id = task.rpartition("/")
        if path not in PATHS:
            raise failed()
        answer = await self.http.call("GET", f"/v1/{path}/{quote(task_id, safe='')}")
        if not answer.ok:
            raise fault(answer)
        data = _data(answer.json())
        status = data.get("task_status")
        if status in STATES:
            return Polled(STATES[status])  # type: ignore[arg-type]
        if status == "succeed":
            result = data.get("task_result")
            files = (
                result.get("images" if path == IMAGES else "videos")
                if isinstance(result, dict)
                else None
            )
            urls = tuple(
                f["url"]
                for f in files or ()
                if isinstance(f, dict) and isinstance(f.get("url"), str)
            )
            return Polled("succeeded", results=urls)
        if status == "failed":
            message = data.get("task_status_msg")
            blocked = says_blocked(message) or (
                isinstance(message, str) and _RISK.search(message) is not None
            )
            return Polled(
                "failed", code="CONTENT_BLOCKED" if blocked else "UPSTREAM_FAILED"
            )
        raise failed()

    async def cancel(self, task: str) -> None:
        """Nothing to call: Kling cannot cancel a task (it may still bill it)."""


def _data(body: Any) -> dict[str, Any]:
    """The `data` of a successful answer (code 0), or a failure."""
    data = body.get("data") if isinstance(body, dict) else None
    if code_of(body) != 0 or not isinstance(data, dict):
        raise failed()
    return data


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `kling` upstream: Kling's API in the shared task shape."""
    return TaskUpstream(KlingApi(config))
