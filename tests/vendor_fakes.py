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
"""

from __future__ import annotations

import base64
import itertools
import secrets
from dataclasses import dataclass
from typing import Any

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
