"""Fake model upstreams on loopback: real HTTP servers speaking each vendor's API.

Each fake is an aiohttp app on 127.0.0.1 and a free port, started by the test
(`async with FakeOpenAI(key) as fake:`), so worker processes reach it over
real sockets. Bodies follow the vendors' documented examples; faults are
scripted per request.

API (shared by every fake; R2 adds FakeFal and FakeReplicate on FakeServer):
    fake.base_url                  "http://127.0.0.1:PORT" (the upstream's base_url)
    fake.requests                  [Recorded(method, path, headers, body, at)], in
                                   order (`at`: time.monotonic() on arrival)
    fake.api_requests(path)        the recorded requests to one path
    fake.script(*answers)          Canned answers served, in order, before the
                                   normal ones by routes that call `self.scripted()`:
                                   Canned(status, body (dict -> JSON, bytes, str),
                                   headers, delay seconds, drop=True: close the
                                   connection without answering)
    fake.serve(name, body, content_type) -> url   a file at /files/NAME
    fake.redirect_to(url) -> url   a URL answering 302 to `url`
    fake.serve_flood(name, size, declared=True) -> url   a PNG-looking body of
                                   `size` bytes (declared: with Content-Length;
                                   else chunked), for the size limits
    fake.url_at(host, path)        the same port under another host name
                                   (e.g. "localhost": a private address that is
                                   not the upstream's own host)
    png(width, height) / mp4() bytes of real media for results
Subclasses add their routes in `routes()` and call `await self.scripted(request)`
first: it returns the canned response (or None to go on normally).

FakeOpenAI(key, mode="b64"|"url"): POST /v1/images/generations as the Images
API: checks `Authorization: Bearer KEY` (401 with OpenAI's body otherwise),
answers `data` with `n` images of the requested `size`, as `b64_json` or as
`url`s served by the fake itself. OPENAI_ERRORS holds OpenAI's error bodies.
"""

from __future__ import annotations

import asyncio
import base64
import io
import itertools
import json
import secrets
import socket
import time
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

from aiohttp import web
from PIL import Image


@dataclass(frozen=True)
class Recorded:
    """One request the fake received."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.monotonic)

    def json(self) -> Any:
        """The request's JSON body."""
        return json.loads(self.body)


@dataclass(frozen=True)
class Canned:
    """One scripted answer: a status and body, after a delay, or a dropped line."""

    status: int = 200
    body: dict[str, Any] | bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    drop: bool = False


def png(width: int = 64, height: int = 64, color: str = "teal") -> bytes:
    """A real PNG of the given size."""
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), color).save(buffer, "PNG")
    return buffer.getvalue()


def mp4() -> bytes:
    """A real short H.264 MP4 (drawn by the demo's own renderer)."""
    from service.studio.media.demo_art import render_video

    return render_video("a fake clip", 1, 320, 240, 1.0, fps=12)


class FakeServer:
    """A vendor API on loopback: routes, recorded requests, scripted faults."""

    def __init__(self) -> None:
        self.requests: list[Recorded] = []
        self._script: list[Canned] = []
        self._files: dict[str, tuple[bytes, str]] = {}
        self._floods: dict[str, tuple[int, bool]] = {}
        self._names = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """Where the upstream lives (its configured base_url)."""
        return f"http://127.0.0.1:{self.port}"

    def url_at(self, host: str, path: str) -> str:
        """The same server under another host name."""
        return f"http://{host}:{self.port}{path}"

    def routes(self) -> list[web.RouteDef]:
        """The vendor's routes (subclasses)."""
        return []

    def script(self, *answers: Canned) -> None:
        """Queue canned answers for the next API requests."""
        self._script.extend(answers)

    def serve(self, name: str, body: bytes, content_type: str) -> str:
        """Serve a file at /files/NAME; return its URL."""
        self._files[name] = (body, content_type)
        return f"{self.base_url}/files/{name}"

    def serve_flood(self, name: str, size: int, *, declared: bool = True) -> str:
        """Serve `size` bytes that start like a PNG; return the URL."""
        self._floods[name] = (size, declared)
        return f"{self.base_url}/files/{name}"

    def redirect_to(self, url: str) -> str:
        """Return a URL of this server that answers 302 to `url`."""
        name = f"hop-{next(self._names)}"
        self._files[name] = (url.encode(), "redirect")
        return f"{self.base_url}/files/{name}"

    def api_requests(self, path: str) -> list[Recorded]:
        """The recorded requests to one path."""
        return [recorded for recorded in self.requests if recorded.path == path]

    async def scripted(self, request: web.Request) -> web.StreamResponse | None:
        """Record the request; answer with the next canned answer, if any."""
        self.requests.append(
            Recorded(
                request.method,
                request.path,
                dict(request.headers),
                await request.read(),
            )
        )
        if not self._script:
            return None
        canned = self._script.pop(0)
        if canned.delay:
            await asyncio.sleep(canned.delay)
        if canned.drop:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        body = canned.body
        if isinstance(body, dict):
            return web.json_response(body, status=canned.status, headers=canned.headers)
        data = body.encode() if isinstance(body, str) else body
        return web.Response(status=canned.status, body=data, headers=canned.headers)

    async def _file(self, request: web.Request) -> web.StreamResponse:
        if flood := self._floods.get(request.match_info["name"]):
            return await self._flood(request, *flood)
        body, content_type = self._files.get(request.match_info["name"], (b"", ""))
        if content_type == "redirect":
            raise web.HTTPFound(body.decode())
        if not content_type:
            raise web.HTTPNotFound()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def _flood(
        self, request: web.Request, size: int, declared: bool
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "image/png"})
        if declared:
            response.content_length = size
        else:
            response.enable_chunked_encoding()
        await response.prepare(request)
        chunk = png()[:8] + bytes(1024 * 1024 - 8)
        sent = 0
        try:
            while sent < size:
                await response.write(chunk[: size - sent])
                sent += len(chunk)
                chunk = bytes(len(chunk))
        except ConnectionError:
            return response  # the client gave up: what the limit is for
        await response.write_eof()
        return response

    async def __aenter__(self) -> Self:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.add_routes([*self.routes(), web.get("/files/{name}", self._file)])
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        await web.SockSite(self._runner, listener).start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._runner is not None:
            await self._runner.cleanup()


# OpenAI's error bodies, as its API reference and error-codes guide show them.
OPENAI_ERRORS: dict[str, dict[str, Any]] = {
    "content_policy_violation": {
        "error": {
            "code": "content_policy_violation",
            "message": "Your request was rejected as a result of our safety system."
            " Your prompt may contain text that is not allowed by our safety system.",
            "param": None,
            "type": "invalid_request_error",
        }
    },
    "moderation_blocked": {
        "error": {
            "message": "Your request was rejected by the safety system. If you believe"
            " this is an error, contact us at help.openai.com and include the"
            " request ID req_4b4ba36d4e1e4a4d9c0e2c0f0c2e6a7b.",
            "type": "image_generation_user_error",
            "param": None,
            "code": "moderation_blocked",
        }
    },
    "invalid_value": {
        "error": {
            "message": "Invalid value: '999x999'. Supported values are: '1024x1024',"
            " '1024x1536', '1536x1024', and 'auto'.",
            "type": "invalid_request_error",
            "param": "size",
            "code": "invalid_value",
        }
    },
    "rate_limit_exceeded": {
        "error": {
            "message": "Rate limit reached for gpt-image-1 in organization org-abc on"
            " images per minute (IPM): Limit 5, Used 5, Requested 1.",
            "type": "requests",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    },
    "server_error": {
        "error": {
            "message": "The server had an error while processing your request."
            " Sorry about that!",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    },
}


def openai_key_refused(key: str) -> dict[str, Any]:
    """OpenAI's 401 body, which echoes the end of the key it was given."""
    return {
        "error": {
            "message": f"Incorrect API key provided: sk-****{key[-4:]}. You can find"
            " your API key at https://platform.openai.com/account/api-keys.",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


class FakeOpenAI(FakeServer):
    """The OpenAI Images API: POST /v1/images/generations."""

    def __init__(self, key: str, mode: str = "b64") -> None:
        super().__init__()
        self.key = key
        self.mode = mode

    def routes(self) -> list[web.RouteDef]:
        """The one route of the Images API this service uses."""
        return [web.post("/v1/images/generations", self._generate)]

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            given = request.headers.get("Authorization", "")
            return web.json_response(openai_key_refused(given), status=401)
        body = await request.json()
        width, _, height = str(body.get("size", "1024x1024")).partition("x")
        image = png(int(width), int(height))
        data: list[dict[str, str]] = []
        for _ in range(int(body.get("n", 1))):
            if self.mode == "url":
                name = f"img-{next(self._names)}.png"
                data.append({"url": self.serve(name, image, "image/png")})
            else:
                data.append({"b64_json": base64.b64encode(image).decode()})
        return web.json_response(
            {
                "created": 1713833628,
                "data": data,
                "background": "opaque",
                "output_format": body.get("output_format", "png"),
                "quality": "high",
                "size": body.get("size", "1024x1024"),
                "usage": {
                    "total_tokens": 100,
                    "input_tokens": 50,
                    "output_tokens": 50,
                    "input_tokens_details": {"text_tokens": 10, "image_tokens": 40},
                },
            }
        )


# fal's error bodies, as its "Model Errors" page shows them (`detail`: typed errors).
FAL_ERRORS: dict[str, dict[str, Any]] = {
    "content_policy_violation": {
        "detail": [
            {
                "loc": ["body", "prompt"],
                "msg": "The content could not be processed because it contained"
                " material flagged by a content checker.",
                "type": "content_policy_violation",
                "url": "https://docs.fal.ai/errors#content_policy_violation",
                "ctx": {},
                "input": "a forbidden thing",
            }
        ]
    },
    "invalid": {
        "detail": [
            {
                "loc": ["body", "num_images"],
                "msg": "Input should be less than or equal to 4",
                "type": "less_than_equal",
                "url": "https://docs.fal.ai/errors#less_than_equal",
                "ctx": {"le": 4},
                "input": 9,
            }
        ]
    },
    "unauthorized": {"detail": "Invalid Key Authorization header format."},
}


@dataclass
class FalJob:
    """One request in the fake fal queue."""

    endpoint: str
    input: dict[str, Any]
    polls: int = 0
    canceled: bool = False


class FakeFal(FakeServer):
    """fal's queue API: submit, status (with queue position and logs), result, cancel.

    Like fal, the status, response and cancel URLs use the endpoint's app id
    (its first two segments). A request is IN_QUEUE at its first status poll,
    IN_PROGRESS (with `logs`) at the second and while `hold` is set, then
    COMPLETED. `refusal` = (status, body) makes the result that error (and
    with `refusal_in_status`, the COMPLETED status carries `error` and
    `error_type` too); `result` replaces the normal result body.
    """

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.jobs: dict[str, FalJob] = {}
        self.hold = False
        self.logs = ["Loading the model", "Generating: 50%|#####     | 14/28"]
        self.refusal: tuple[int, dict[str, Any]] | None = None
        self.refusal_in_status = False
        self.result: dict[str, Any] | None = None
        self._clip: bytes | None = None

    def routes(self) -> list[web.RouteDef]:
        """Submit on any endpoint path; the rest under the app id's /requests/."""
        request = "/{owner}/{app}/requests/{rid}"
        return [
            web.get(request + "/status", self._status),
            web.put(request + "/cancel", self._cancel),
            web.get(request, self._result),
            web.get("/huge/{name}", huge_file),
            web.post("/{endpoint:.+}", self._submit),
        ]

    def canceled(self) -> list[str]:
        """The request ids a cancel reached."""
        return [rid for rid, job in self.jobs.items() if job.canceled]

    def _authorized(self, request: web.Request) -> bool:
        return request.headers.get("Authorization") == f"Key {self.key}"

    def _urls(self, endpoint: str, rid: str) -> dict[str, str]:
        app = "/".join(endpoint.split("/")[:2])
        base = f"{self.base_url}/{app}/requests/{rid}"
        return {
            "response_url": base,
            "status_url": base + "/status",
            "cancel_url": base + "/cancel",
        }

    async def _submit(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if not self._authorized(request):
            return web.json_response(FAL_ERRORS["unauthorized"], status=401)
        endpoint = request.match_info["endpoint"]
        rid = str(uuid.uuid4())
        self.jobs[rid] = FalJob(endpoint, await request.json())
        return web.json_response(
            {
                "status": "IN_QUEUE",
                "request_id": rid,
                **self._urls(endpoint, rid),
                "logs": None,
                "metrics": {},
                "queue_position": 0,
            }
        )

    def _job(self, request: web.Request) -> FalJob:
        job = self.jobs.get(request.match_info["rid"])
        if job is None:
            raise web.HTTPNotFound(
                text=json.dumps({"detail": "Request not found"}),
                content_type="application/json",
            )
        return job

    async def _status(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if not self._authorized(request):
            return web.json_response(FAL_ERRORS["unauthorized"], status=401)
        job = self._job(request)
        job.polls += 1
        urls = self._urls(job.endpoint, request.match_info["rid"])
        if job.polls == 1:
            return web.json_response(
                {"status": "IN_QUEUE", "queue_position": 1, **urls}
            )
        logs = [
            {
                "message": line,
                "level": "INFO",
                "source": "user",
                "timestamp": "2026-11-23T12:00:00.000000",
            }
            for line in self.logs
        ]
        if self.hold or job.polls == 2:
            return web.json_response({"status": "IN_PROGRESS", "logs": logs, **urls})
        done: dict[str, Any] = {
            "status": "COMPLETED",
            "logs": logs,
            "metrics": {"inference_time": 1.5},
            **urls,
        }
        if self.refusal and self.refusal_in_status:
            detail = self.refusal[1].get("detail")
            first = detail[0] if isinstance(detail, list) and detail else {}
            done["error"] = first.get("msg", "failed")
            done["error_type"] = first.get("type", "")
        return web.json_response(done)

    async def _result(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if not self._authorized(request):
            return web.json_response(FAL_ERRORS["unauthorized"], status=401)
        job = self._job(request)
        if self.refusal is not None:
            return web.json_response(self.refusal[1], status=self.refusal[0])
        if self.result is not None:
            return web.json_response(self.result)
        name = f"{request.match_info['rid']}-{next(self._names)}"
        if "video" in job.endpoint:
            if self._clip is None:
                self._clip = mp4()
            url = self.serve(name + ".mp4", self._clip, "video/mp4")
            return web.json_response(
                {
                    "video": {
                        "url": url,
                        "content_type": "video/mp4",
                        "file_name": "output.mp4",
                        "file_size": len(self._clip),
                    }
                }
            )
        count = int(job.input.get("num_images", 1))
        image = png()
        images = [
            {
                "url": self.serve(f"{name}-{index}.png", image, "image/png"),
                "content_type": "image/png",
                "file_name": f"{index}.png",
                "file_size": len(image),
                "width": 64,
                "height": 64,
            }
            for index in range(count)
        ]
        return web.json_response(
            {
                "images": images,
                "seed": job.input.get("seed", 42),
                "has_nsfw_concepts": [False] * count,
                "prompt": job.input.get("prompt", ""),
            }
        )

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if not self._authorized(request):
            return web.json_response(FAL_ERRORS["unauthorized"], status=401)
        self._job(request).canceled = True
        return web.json_response({"status": "CANCELLATION_REQUESTED"}, status=202)


# Replicate's answers, as its HTTP API reference shows them.
REPLICATE_SENSITIVE: str = (
    "The input or output was flagged as sensitive. Please try again with different"
    " inputs. (E005)"
)
REPLICATE_ERRORS: dict[str, dict[str, Any]] = {
    "invalid": {
        "detail": "- input.duration: duration must be one of the following: 6, 10\n",
        "status": 422,
        "title": "Input validation failed",
        "invalid_fields": [
            {
                "type": "enum",
                "field": "input.duration",
                "description": "duration must be one of the following: 6, 10",
            }
        ],
    },
    "sensitive": {
        "detail": "The prompt was flagged as sensitive. (E005)",
        "status": 422,
        "title": "Input validation failed",
    },
    "throttled": {
        "detail": "Request was throttled. Expected available in 1 second.",
        "status": 429,
        "title": "Request was throttled",
    },
    "unauthenticated": {
        "detail": "You did not pass a valid authentication token",
        "status": 401,
        "title": "Unauthenticated",
    },
}


class FakeReplicate(FakeServer):
    """Replicate's predictions: create (official model or version), get, cancel.

    A prediction starts `starting`; with `Prefer: wait` (and no `hold`) it is
    finished at once. Each poll moves it on: `processing` (with tqdm-style
    `logs`) at the first and while `hold` is set, then succeeded with output
    URLs served here (a video: one URL; images: a list), or failed with
    `failure` as its error. `output` replaces the normal output.
    """

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key
        self.predictions: dict[str, dict[str, Any]] = {}
        self.polls: dict[str, int] = {}
        self.hold = False
        self.logs = "Generating video...\n 50%|#####     | 10/20 [00:05<00:05]"
        self.failure: str | None = None
        self.output: Any = None
        self._clip: bytes | None = None

    def routes(self) -> list[web.RouteDef]:
        """The prediction routes this service uses."""
        return [
            web.post("/v1/models/{owner}/{name}/predictions", self._create),
            web.post("/v1/predictions", self._create),
            web.get("/v1/predictions/{pid}", self._get),
            web.post("/v1/predictions/{pid}/cancel", self._cancel),
            web.get("/huge/{name}", huge_file),
        ]

    def canceled(self) -> list[str]:
        """The prediction ids a cancel reached."""
        return [pid for pid, p in self.predictions.items() if p["status"] == "canceled"]

    def _refused(self, request: web.Request) -> web.StreamResponse | None:
        if request.headers.get("Authorization") == f"Bearer {self.key}":
            return None
        return web.json_response(REPLICATE_ERRORS["unauthenticated"], status=401)

    async def _create(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        body = await request.json()
        owner, name = request.match_info.get("owner"), request.match_info.get("name")
        pid = secrets.token_hex(13)
        prediction: dict[str, Any] = {
            "id": pid,
            "model": f"{owner}/{name}" if owner else "replicate/hello-world",
            "version": body.get("version", "hidden"),
            "input": body.get("input", {}),
            "logs": "",
            "output": None,
            "data_removed": False,
            "error": None,
            "status": "starting",
            "created_at": "2026-11-23T12:00:00.000Z",
            "urls": {
                "cancel": f"{self.base_url}/v1/predictions/{pid}/cancel",
                "get": f"{self.base_url}/v1/predictions/{pid}",
                "stream": f"{self.base_url}/stream/{pid}",
                "web": f"https://replicate.com/p/{pid}",
            },
        }
        self.predictions[pid] = prediction
        self.polls[pid] = 0
        if request.headers.get("Prefer", "").startswith("wait") and not self.hold:
            self._finish(prediction)
        return web.json_response(prediction, status=201)

    def _finish(self, prediction: dict[str, Any]) -> None:
        if self.failure is not None:
            prediction.update(status="failed", error=self.failure)
            return
        prediction["status"] = "succeeded"
        if self.output is not None:
            prediction["output"] = self.output
            return
        name = f"{prediction['id']}-{next(self._names)}"
        if "duration" in prediction["input"]:
            if self._clip is None:
                self._clip = mp4()
            prediction["output"] = self.serve(name + ".mp4", self._clip, "video/mp4")
            return
        image = png()
        count = int(prediction["input"].get("num_outputs", 1))
        urls = [self.serve(f"{name}-{i}.png", image, "image/png") for i in range(count)]
        prediction["output"] = (
            urls[0] if "num_outputs" not in prediction["input"] else urls
        )

    async def _get(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        pid = request.match_info["pid"]
        prediction = self.predictions.get(pid)
        if prediction is None:
            return web.json_response(
                {"detail": "Not found.", "status": 404, "title": "Not found"},
                status=404,
            )
        if prediction["status"] in ("starting", "processing"):
            self.polls[pid] += 1
            if self.hold or self.polls[pid] == 1:
                prediction.update(status="processing", logs=self.logs)
            else:
                self._finish(prediction)
        return web.json_response(prediction)

    async def _cancel(self, request: web.Request) -> web.StreamResponse:
        if (canned := await self.scripted(request)) is not None:
            return canned
        if (refused := self._refused(request)) is not None:
            return refused
        prediction = self.predictions.get(request.match_info["pid"])
        if prediction is None:
            return web.json_response(
                {"detail": "Not found.", "status": 404}, status=404
            )
        if prediction["status"] in ("starting", "processing"):
            prediction["status"] = "canceled"
        return web.json_response(prediction)


async def huge_file(request: web.Request) -> web.StreamResponse:
    """A "2 GB image": a PNG signature under a Content-Length of 2 GiB, then silence."""
    response = web.StreamResponse(headers={"Content-Type": "image/png"})
    response.content_length = 2 * 1024**3
    await response.prepare(request)
    await response.write(png()[:64])
    await asyncio.sleep(2)  # never sends the rest: the reader must give up at once
    return response
