"""Fake task vendors on loopback (Ark, DashScope, Kling, MiniMax), in their own shapes.

Every fake keeps its tasks in one neutral model (`VendorTask`) and renders it
the way its vendor does. A task moves on each poll: waiting at creation,
running at the first poll (and while `hold` is set; `queued` keeps it
waiting), then succeeded (a result
served by the fake itself) or, with `failure` set, failed with that vendor
code; `ending` replaces the end ("expired", "cancelled"). `creates` counts the
tasks each fake accepted, `canceled()` the tasks a cancel reached. Faults are
scripted with `fake.script(Canned(...))` as in upstream_fakes.

    FakeArk(key)         POST /api/v3/images/generations (b64_json at once),
                         /api/v3/contents/generations/tasks (create, GET, DELETE)
    FakeDashScope(key)   Wan video-synthesis (403 without X-DashScope-Async),
                         /api/v1/tasks/{id} (+ /cancel), Qwen-Image at once
    FakeKling("AK:SK")   /v1/videos/*, /v1/images/generations behind a checked JWT
    FakeMiniMax(key)     video_generation, query, files/retrieve, image_generation;
                         errors as HTTP 200 with base_resp.status_code
    FakeComfyUI()        a ComfyUI server: the queue runs prompts step by step,
                         progress over /ws, files in /history and /view
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import itertools
import secrets
import uuid
from dataclasses import dataclass
from typing import Any, Self

import jwt
from aiohttp import web

from .upstream_fakes import FakeServer, mp4, png

_CLIP: list[bytes] = []


def clip() -> bytes:
    """The one MP4 every fake serves (drawn once per process)."""
    if not _CLIP:
        _CLIP.append(mp4())
    return _CLIP[0]


@dataclass
class VendorTask:
    """One task, in neutral terms each fake renders its own way."""

    id: str
    kind: str
    body: Any
    state: str = "waiting"
    polls: int = 0
    url: str = ""
    code: str = ""


class FakeTasks(FakeServer):
    """The shared task life of the fakes: create, move on per poll, cancel."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.tasks: dict[str, VendorTask] = {}
        self.hold = False
        self.queued = False  # tasks stay waiting (in the vendor's queue)
        self.failure: str | None = None
        self.ending: str | None = None
        self._ids = itertools.count(1)

    @property
    def creates(self) -> int:
        """How many tasks the vendor accepted (and would bill)."""
        return len(self.tasks)

    def canceled(self) -> list[str]:
        """The tasks a cancel reached while they could still be cancelled."""
        return [t.id for t in self.tasks.values() if t.state == "cancelled"]

    def new_task(self, kind: str, body: Any, prefix: str = "") -> VendorTask:
        """Accept a task."""
        task_id = f"{prefix}{next(self._ids):04d}{secrets.token_hex(6)}"
        task = VendorTask(task_id, kind, body)
        self.tasks[task_id] = task
        return task

    def advance(self, task: VendorTask) -> VendorTask:
        """Move a task on by one poll."""
        if task.state in ("waiting", "running"):
            task.polls += 1
            if self.queued:
                return task
            if task.polls == 1 or self.hold:
                task.state = "running"
            elif self.ending is not None:
                task.state = self.ending
            elif self.failure is not None:
                task.state, task.code = "failed", self.failure
            else:
                task.state = "succeeded"
                task.url = self.result(task)
        return task

    def result(self, task: VendorTask) -> str:
        """Serve the task's result; return its URL."""
        name = f"{task.id}-{next(self._names)}"
        if task.kind == "video":
            return self.serve(name + ".mp4", clip(), "video/mp4")
        return self.serve(name + ".png", png(), "image/png")

    def bearer(self, request: web.Request) -> bool:
        """Tell whether the request carries our key as a Bearer token."""
        return request.headers.get("Authorization") == f"Bearer {self.key}"


# Ark's error bodies (volcengine.com/docs/82379/1299023, ark-cli error-codes.md).
def ark_error(code: str, message: str = "", kind: str = "BadRequest") -> dict[str, Any]:
    """An Ark error body."""
    return {
        "error": {
            "code": code,
            "message": f"{message or code} Request ID: 0217{secrets.token_hex(8)}",
            "param": "",
            "type": kind,
        }
    }


ARK_STATES = {"waiting": "queued"}


class FakeArk(FakeTasks):
    """Volcengine Ark: Seedream (synchronous) and Seedance tasks."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.images = 0
        self.image_failure: str | None = None

    def routes(self) -> list[web.RouteDef]:
        """Ark's image and content-generation routes."""
        tasks = "/api/v3/contents/generations/tasks"
        return [
            web.post("/api/v3/images/generations", self._image),
            web.post(tasks, self._create),
            web.get(tasks + "/{id}", self._get),
            web.delete(tasks + "/{id}", self._delete),
        ]

    def _refused(self, request: web.Request) -> web.StreamResponse | None:
        if self.bearer(request):
            return None
        body = ark_error(
            "AuthenticationError", "the API key is invalid", "Unauthorized"
        )
        return web.json_response(body, status=401)

    async def _image(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        if self.image_failure:
            return web.json_response(ark_error(self.image_failure), status=400)
        self.images += 1
        width, _, height = str(body["size"]).partition("x")
        image = png(int(width) // 32, int(height) // 32)
        return web.json_response(
            {
                "model": body["model"],
                "created": 1764057600,
                "data": [
                    {
                        "b64_json": base64.b64encode(image).decode(),
                        "size": body["size"],
                    }
                ],
                "usage": {"generated_images": 1, "output_tokens": 16384,
                          "total_tokens": 16384},
                "error": None,
            }
        )  # fmt: skip

    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.new_task("video", await request.json(), "cgt-20261125")
        return web.json_response({"id": task.id, "safety_identifier": None})

    def _task(self, task: VendorTask) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": task.id,
            "model": task.body["model"],
            "status": ARK_STATES.get(task.state, task.state),
            "error": None,
            "created_at": 1764057600,
            "updated_at": 1764057660,
        }
        if task.state == "succeeded":
            body |= {
                "content": {"video_url": task.url},
                "usage": {"completion_tokens": 108900, "total_tokens": 108900},
                "seed": task.body.get("seed"),
                "resolution": task.body.get("resolution"),
                "ratio": task.body.get("ratio"),
                "duration": task.body.get("duration"),
                "framespersecond": 24,
            }
        if task.state == "failed":
            body["error"] = {"code": task.code, "message": "refused"}
        return body

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.match_info["id"])
        if task is None:
            return web.json_response(
                ark_error("ResourceNotFound", kind="NotFound"), status=404
            )
        return web.json_response(self._task(self.advance(task)))

    async def _delete(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.match_info["id"])
        if task is None:
            return web.json_response(
                ark_error("ResourceNotFound", kind="NotFound"), status=404
            )
        if task.state == "running":
            return web.json_response(
                ark_error("InvalidAction.TaskRunning", "a running task cannot be"
                          " cancelled"), status=400,
            )  # fmt: skip
        if task.state == "waiting":
            task.state = "cancelled"
        return web.json_response({})


# DashScope's error bodies (help.aliyun.com error-code-start).
def dashscope_error(code: str, message: str = "") -> dict[str, Any]:
    """A DashScope error body."""
    return {
        "request_id": secrets.token_hex(16),
        "code": code,
        "message": message or code,
    }


DASHSCOPE_STATES = {
    "waiting": "PENDING",
    "running": "RUNNING",
    "succeeded": "SUCCEEDED",
    "failed": "FAILED",
    "cancelled": "CANCELED",
    "expired": "UNKNOWN",
}


class FakeDashScope(FakeTasks):
    """Alibaba Model Studio: Wan video tasks (async header required), Qwen-Image."""

    def routes(self) -> list[web.RouteDef]:
        """DashScope's video, multimodal-generation and task routes."""
        return [
            web.post(
                "/api/v1/services/aigc/video-generation/video-synthesis", self._create
            ),
            web.post(
                "/api/v1/services/aigc/multimodal-generation/generation", self._image
            ),
            web.get("/api/v1/tasks/{id}", self._get),
            web.post("/api/v1/tasks/{id}/cancel", self._cancel),
        ]

    def _refused(self, request: web.Request) -> web.StreamResponse | None:
        if self.bearer(request):
            return None
        body = dashscope_error("InvalidApiKey", "Invalid API-key provided.")
        return web.json_response(body, status=401)

    @staticmethod
    def _invalid(body: dict[str, Any], prompt: str) -> web.StreamResponse | None:
        """DashScope's own bounds: parameters.seed 0..2147483647, a Wan prompt of
        at most 800 characters (reference J §1)."""
        seed = body.get("parameters", {}).get("seed")
        if seed is not None and not 0 <= seed <= 2**31 - 1:
            message = "The seed must be in the range [0, 2147483647]."
        elif body.get("model", "").startswith("wan") and len(prompt) > 800:
            message = "Range of input length should be [1, 800]"
        else:
            return None
        error = dashscope_error("InvalidParameter", message)
        return web.json_response(error, status=400)

    async def _image(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        if self.failure:
            return web.json_response(dashscope_error(self.failure), status=400)
        if (invalid := self._invalid(body, "")) is not None:
            return invalid
        count = body["parameters"]["n"]
        content = [
            {"image": self.serve(f"q{next(self._names)}.png", png(), "image/png")}
            for _ in range(count)
        ]
        return web.json_response(
            {
                "output": {
                    "choices": [
                        {
                            "finish_reason": "stop",
                            "message": {"role": "assistant", "content": content},
                        }
                    ]
                },
                "usage": {"width": 1328, "height": 1328, "image_count": count},
                "request_id": secrets.token_hex(16),
            }
        )

    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        if request.headers.get("X-DashScope-Async") != "enable":
            body = dashscope_error(
                "AccessDenied", "current user api does not support synchronous calls"
            )
            return web.json_response(body, status=403)
        sent = await request.json()
        if (invalid := self._invalid(sent, sent["input"]["prompt"])) is not None:
            return invalid
        task = self.new_task("video", sent)
        return web.json_response(
            {
                "output": {"task_id": task.id, "task_status": "PENDING"},
                "request_id": secrets.token_hex(16),
            }
        )

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.match_info["id"])
        if task is None:
            output: dict[str, Any] = {"task_id": request.match_info["id"],
                                      "task_status": "UNKNOWN"}  # fmt: skip
        else:
            self.advance(task)
            output = {"task_id": task.id, "task_status": DASHSCOPE_STATES[task.state]}
            if task.state == "succeeded":
                output["video_url"] = task.url
            if task.state == "failed":
                output |= {"code": task.code, "message": "refused"}
        return web.json_response(
            {"request_id": secrets.token_hex(16), "output": output}
        )

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.match_info["id"])
        if task is None or task.state != "waiting":
            body = dashscope_error("UnsupportedOperation", "only PENDING tasks")
            return web.json_response(body, status=400)
        task.state = "cancelled"
        return web.json_response({"request_id": secrets.token_hex(16)})


KLING_STATES = {
    "waiting": "submitted",
    "running": "processing",
    "succeeded": "succeed",
    "failed": "failed",
}


def kling_error(code: int, message: str) -> dict[str, Any]:
    """A Kling error body."""
    return {"code": code, "message": message, "request_id": secrets.token_hex(16)}


def _kling_reads(image: object) -> bool:
    """Kling's own check of a reference: bare base64 of a JPEG or PNG, 300 px a side."""
    from PIL import Image

    if not isinstance(image, str):
        return False
    try:
        with Image.open(io.BytesIO(base64.b64decode(image, validate=True))) as picture:
            return picture.format in ("JPEG", "PNG") and min(picture.size) >= 300
    except (ValueError, OSError):
        return False


class FakeKling(FakeTasks):
    """The Kling open platform: tasks behind a JWT it checks (HS256, iss, exp, nbf).

    `key` is "ACCESS:SECRET" as the operator configures it; `tokens` records
    every verified token's claims. Moderation after submission: a failed
    task with `failure` as its task_status_msg.
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.access, _, self.secret = key.partition(":")
        self.tokens: list[dict[str, Any]] = []

    def routes(self) -> list[web.RouteDef]:
        """Kling's task routes."""
        return [
            web.post("/v1/{kind}/{action}", self._create),
            web.get("/v1/{kind}/{action}/{id}", self._get),
        ]

    def _refused(self, request: web.Request) -> web.StreamResponse | None:
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme != "Bearer":
            return web.json_response(kling_error(1000, "auth empty"), status=401)
        try:
            claims = jwt.decode(
                token,
                self.secret,
                algorithms=["HS256"],
                issuer=self.access,
                options={"require": ["iss", "exp", "nbf"]},
            )
        except jwt.ImmatureSignatureError:
            return web.json_response(kling_error(1003, "not yet valid"), status=401)
        except jwt.ExpiredSignatureError:
            return web.json_response(kling_error(1004, "expired"), status=401)
        except jwt.PyJWTError:
            return web.json_response(kling_error(1002, "auth invalid"), status=401)
        self.tokens.append(claims)
        return None

    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        path = f"{request.match_info['kind']}/{request.match_info['action']}"
        kind = "image" if path == "images/generations" else "video"
        sent = await request.json()
        if "image" in sent and not _kling_reads(sent["image"]):
            error = kling_error(1201, "image: jpg/png of at least 300px required")
            return web.json_response(error, status=400)
        task = self.new_task(kind, sent)
        return web.json_response(
            {
                "code": 0,
                "message": "SUCCEED",
                "request_id": secrets.token_hex(16),
                "data": {
                    "task_id": task.id,
                    "task_info": {},
                    "task_status": "submitted",
                    "created_at": 1764057600000,
                    "updated_at": 1764057600000,
                },
            }
        )

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.match_info["id"])
        if task is None:
            return web.json_response(kling_error(1203, "task not found"), status=404)
        self.advance(task)
        data: dict[str, Any] = {
            "task_id": task.id,
            "task_status": KLING_STATES[task.state],
            "task_status_msg": "",
            "created_at": 1764057600000,
            "updated_at": 1764057660000,
        }
        if task.state == "succeeded":
            if task.kind == "image":
                count = int(task.body.get("n", 1))
                images = [{"index": i, "url": self.result(task)} for i in range(count)]
                data["task_result"] = {"images": images}
            else:
                videos = [{"id": task.id, "url": task.url, "duration": "5.041"}]
                data["task_result"] = {"videos": videos}
            data["final_unit_deduction"] = "1"
        if task.state == "failed":
            data["task_status_msg"] = self.failure
        return web.json_response(
            {"code": 0, "message": "SUCCEED", "request_id": "r", "data": data}
        )


MINIMAX_STATES = {"waiting": "Queueing", "running": "Processing"}


def minimax_answer(code: int, message: str, **body: Any) -> dict[str, Any]:
    """A MiniMax answer with its base_resp (errors come with HTTP 200)."""
    return {**body, "base_resp": {"status_code": code, "status_msg": message}}


class FakeMiniMax(FakeTasks):
    """MiniMax: video_generation, query, files/retrieve; image_generation.

    A failed task answers status Fail with base_resp `failure` as its code
    (1027: output sensitive; 1024: internal); `refusal` makes the next create
    answer that status code (with HTTP 200, as MiniMax does).
    """

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.refusal: int | None = None

    def routes(self) -> list[web.RouteDef]:
        """MiniMax's V1 video and image routes."""
        return [
            web.post("/v1/video_generation", self._create),
            web.get("/v1/query/video_generation", self._query),
            web.get("/v1/files/retrieve", self._file_retrieve),
            web.post("/v1/image_generation", self._image),
        ]

    def _refused(self, request: web.Request) -> web.StreamResponse | None:
        if self.bearer(request):
            return None
        return web.json_response(minimax_answer(1004, "authorized error"))

    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        if self.refusal is not None:
            return web.json_response(minimax_answer(self.refusal, "refused"))
        task = self.new_task("video", await request.json())
        return web.json_response(minimax_answer(0, "success", task_id=task.id))

    async def _query(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        task = self.tasks.get(request.query.get("task_id", ""))
        if task is None:
            return web.json_response(minimax_answer(2013, "task not found"))
        self.advance(task)
        if task.state == "succeeded":
            return web.json_response(
                minimax_answer(0, "success", task_id=task.id, status="Success",
                               file_id=f"file-{task.id}", video_width=1366,
                               video_height=768)
            )  # fmt: skip
        if task.state in ("failed", "expired", "cancelled"):
            code = int(task.code) if task.code.isdigit() else 0
            return web.json_response(
                minimax_answer(code, "failed", task_id=task.id, status="Fail")
            )
        status = MINIMAX_STATES[task.state]
        return web.json_response(
            minimax_answer(0, "success", task_id=task.id, status=status)
        )

    async def _file_retrieve(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        file_id = request.query.get("file_id", "")
        task = self.tasks.get(file_id.removeprefix("file-"))
        if task is None or not task.url:
            return web.json_response(minimax_answer(2013, "file not found"))
        file = {
            "file_id": file_id,
            "bytes": len(clip()),
            "created_at": 1764057600,
            "filename": "output_aigc.mp4",
            "purpose": "video_generation",
            "download_url": task.url,
            "backup_download_url": task.url,
        }
        return web.json_response(minimax_answer(0, "success", file=file))

    async def _image(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        if self.refusal is not None:
            return web.json_response(minimax_answer(self.refusal, "refused"))
        images = [base64.b64encode(png()).decode() for _ in range(int(body["n"]))]
        return web.json_response(
            minimax_answer(0, "success", id="img", data={"image_base64": images},
                           metadata={"success_count": len(images),
                                     "failed_count": 0})
        )  # fmt: skip


@dataclass
class ComfyPrompt:
    """One queued prompt of the fake ComfyUI."""

    id: str
    graph: dict[str, Any]
    client_id: str
    state: str = "pending"  # running, success, error, interrupted
    step: int = 0
    interrupt: bool = False


class FakeComfyUI(FakeServer):
    """ComfyUI's server: /prompt, /ws, /history, /view, /queue, /interrupt, /upload.

    One runner executes the queue in order: `steps` sampler steps, each a
    `progress` event to the prompt's client over the websocket (`hold` stops
    it before the last step, `queued` keeps the queue from starting), then
    `executed` and `execution_success`, and the history entry names the
    SaveImage node's files (batch_size of them, served by /view). `failure`
    makes a run end in `execution_error` with that exception type.
    """

    def __init__(self, steps: int = 10) -> None:
        super().__init__()
        self.steps = steps
        self.prompts: dict[str, ComfyPrompt] = {}
        self.hold = False
        self.queued = False
        # Seconds /prompt takes to answer after it has queued the prompt.
        self.answer_delay = 0.0
        # Seconds POST /queue {"delete"} takes before it deletes and answers.
        self.delete_delay = 0.0
        self.failure: str | None = None
        self.sockets: dict[str, list[web.WebSocketResponse]] = {}
        self.uploads: dict[str, bytes] = {}
        self._views: dict[str, bytes] = {}
        self._queue_runner: Any = None

    @property
    def creates(self) -> int:
        """How many prompts were queued (each one a GPU run)."""
        return len(self.prompts)

    def routes(self) -> list[web.RouteDef]:
        """The routes a client of ComfyUI uses."""
        return [
            web.post("/prompt", self._prompt),
            web.get("/ws", self._ws),
            web.get("/history/{id}", self._history),
            web.get("/view", self._view),
            web.get("/queue", self._queue),
            web.post("/queue", self._queue_change),
            web.post("/interrupt", self._interrupt),
            web.post("/upload/image", self._upload),
        ]

    async def __aenter__(self) -> Self:
        await super().__aenter__()
        self._queue_runner = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self._queue_runner.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._queue_runner
        for sockets in self.sockets.values():
            for ws in sockets:
                await ws.close()
        await super().__aexit__(*exc)

    async def _send(self, prompt: ComfyPrompt, kind: str, **data: Any) -> None:
        for ws in list(self.sockets.get(prompt.client_id, [])):
            with contextlib.suppress(ConnectionError, RuntimeError):
                await ws.send_json(
                    {"type": kind, "data": {**data, "prompt_id": prompt.id}}
                )

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0.02)
            pending = [p for p in self.prompts.values() if p.state == "pending"]
            if self.queued or not pending:
                continue
            prompt = pending[0]
            prompt.state = "running"
            await self._send(prompt, "execution_start", timestamp=1)
            while prompt.step < self.steps:
                if prompt.interrupt:
                    prompt.state = "interrupted"
                    await self._send(prompt, "execution_interrupted", node_id="3",
                                     node_type="KSampler", executed=[])  # fmt: skip
                    break
                if self.hold and prompt.step == self.steps - 1:
                    await asyncio.sleep(0.02)
                    continue
                prompt.step += 1
                await self._send(
                    prompt, "progress", value=prompt.step, max=self.steps, node="3"
                )
                await asyncio.sleep(0.01)
            if prompt.state == "interrupted":
                continue
            if self.failure is not None:
                prompt.state = "error"
                await self._send(prompt, "execution_error", node_id="3",
                                 node_type="KSampler", exception_type=self.failure,
                                 exception_message="failed", traceback=[])  # fmt: skip
                continue
            prompt.state = "success"
            await self._send(prompt, "executed", node="9", output=self._outputs(prompt))
            await self._send(prompt, "execution_success", timestamp=2)
            await self._send(prompt, "executing", node=None)

    def _outputs(self, prompt: ComfyPrompt) -> dict[str, Any]:
        latent = prompt.graph["5"]["inputs"]
        images = []
        for index in range(int(latent["batch_size"])):
            name = f"studio_{prompt.id[:8]}_{index:05}_.png"
            self._views[name] = png(
                int(latent["width"]) // 16, int(latent["height"]) // 16
            )
            images.append({"filename": name, "subfolder": "", "type": "output"})
        preview = {"filename": "preview.png", "subfolder": "", "type": "temp"}
        return {"images": [*images, preview]}

    async def _prompt(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        body = await request.json()
        graph = body.get("prompt")
        if not isinstance(graph, dict) or not graph:
            return web.json_response(
                {"error": {"type": "no_prompt", "message": "No prompt provided",
                           "details": "", "extra_info": {}}, "node_errors": {}},
                status=400,
            )  # fmt: skip
        prompt_id = str(body.get("prompt_id") or uuid.uuid4())
        self.prompts[prompt_id] = ComfyPrompt(
            prompt_id, graph, body.get("client_id", "")
        )
        await asyncio.sleep(self.answer_delay)
        return web.json_response(
            {"prompt_id": prompt_id, "number": len(self.prompts), "node_errors": {}}
        )

    async def _ws(self, request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        client = request.query.get("clientId", "")
        self.sockets.setdefault(client, []).append(ws)
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {
            "queue_remaining": len(self.prompts)}}, "sid": client}})  # fmt: skip
        await ws.send_bytes(b"\x00\x00\x00\x01\x00\x00\x00\x02" + png()[:16])
        async for _ in ws:
            pass
        self.sockets[client].remove(ws)
        return ws

    async def _history(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        prompt = self.prompts.get(request.match_info["id"])
        if prompt is None or prompt.state in ("pending", "running"):
            return web.json_response({})
        success = prompt.state == "success"
        entry = {
            "prompt": [1, prompt.id, prompt.graph, {}, ["9"]],
            "outputs": {"9": self._outputs(prompt)} if success else {},
            "status": {
                "status_str": "success" if success else "error",
                "completed": success,
                "messages": [["execution_start", {"prompt_id": prompt.id}]],
            },
            "meta": {},
        }
        return web.json_response({prompt.id: entry})

    async def _view(self, request: web.Request) -> web.StreamResponse:
        name = request.query.get("filename", "")
        if request.query.get("type") != "output" or name not in self._views:
            raise web.HTTPNotFound()
        return web.Response(body=self._views[name], content_type="image/png")

    async def _queue(self, request: web.Request) -> web.StreamResponse:
        def items(state: str) -> list[Any]:
            return [
                [n, p.id, p.graph, {"client_id": p.client_id}, ["9"]]
                for n, p in enumerate(self.prompts.values())
                if p.state == state
            ]

        return web.json_response(
            {"queue_running": items("running"), "queue_pending": items("pending")}
        )

    async def _queue_change(self, request: web.Request) -> web.StreamResponse:
        await self.scripted(request)
        await asyncio.sleep(self.delete_delay)
        for prompt_id in (await request.json()).get("delete", []):
            prompt = self.prompts.get(prompt_id)
            if prompt is not None and prompt.state == "pending":
                prompt.state = "deleted"
        return web.Response()

    async def _interrupt(self, request: web.Request) -> web.StreamResponse:
        await self.scripted(request)
        prompt = self.prompts.get((await request.json()).get("prompt_id", ""))
        if prompt is not None and prompt.state == "running":
            prompt.interrupt = True
        return web.Response()

    async def _upload(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        form = await request.post()
        image = form["image"]
        assert isinstance(image, web.FileField)
        self.uploads[image.filename] = image.file.read()
        return web.json_response(
            {"name": image.filename, "subfolder": "", "type": "input"}
        )
