"""The `comfyui` protocol: a self-hosted ComfyUI running the row's workflow.

The model row names a workflow in ComfyUI's API format (content/workflows/)
and `inputs`, which of our fields goes to which `"<node id>.<input name>"`.
The job's own id is the `prompt_id` (and the websocket's clientId): before
queuing, `/history/{id}` and `/queue` are asked whether it is already there,
so a re-delivered job never runs twice. `POST /prompt` queues the graph;
`/ws?clientId=` reports `progress` (sampler steps: 0–1); `GET
/history/{id}` says when it ended and names its output files, which `GET
/view?filename=&subfolder=&type=output` serves. A reference image is first
uploaded (`POST /upload/image`) and its name set on the mapped input. Cancel
is `POST /queue {"delete": [id]}` (queued) and `POST /interrupt {"prompt_id"}`
(running). No key: ComfyUI has none, so it belongs on a private network.

Faults: a 400 of `/prompt` (an invalid graph, `node_errors`) or a run that
ended in `execution_error` is UPSTREAM_FAILED; 5xx and transport faults are
retried. ComfyUI has no moderation of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import quote, urlencode

import aiohttp

from ...settings import UpstreamSettings
from .base import Output, Request, UpstreamError
from .fetch import sniff
from .http import UpstreamHttp, failed, http_fault
from .inputs import MEDIA_TYPES
from .tasks import Polled, TaskUpstream, VendorApi

RECONNECT_SECONDS: Final = 1.0
ENDED: Final = frozenset(
    {"execution_success", "execution_error", "execution_interrupted"}
)
# History output keys that hold files (images; videos by the common save nodes).
FILE_KEYS: Final = ("images", "gifs", "video", "videos")


@dataclass
class Watch:
    """One prompt's websocket listener and the progress it has heard."""

    fraction: float | None = None
    task: asyncio.Task[None] | None = field(default=None, repr=False)


def graph_of(request: Request, reference: str | None = None) -> dict[str, Any]:
    """The workflow with our fields set on the node inputs the row maps."""
    if request.workflow is None:
        raise failed()  # a comfyui row without its workflow (the loader checks)
    graph = copy.deepcopy(dict(request.workflow))
    values: dict[str, Any] = {
        "prompt": request.prompt,
        "negative_prompt": request.negative_prompt,
        "seed": request.seed,
        "width": request.width,
        "height": request.height,
        "count": request.count,
    }
    if reference is not None:
        values["reference"] = reference
    for name, target in request.inputs.items():
        if name not in values:
            continue
        node, _, key = target.partition(".")
        graph[node]["inputs"][key] = values[name]
    return graph


class ComfyApi(VendorApi):
    """Prompts queued under the job's id, watched over the websocket."""

    def __init__(self, config: UpstreamSettings) -> None:
        self.http = UpstreamHttp(config.base_url, "", timeout=config.timeout)
        self._watches: dict[str, Watch] = {}

    async def create(self, request: Request) -> str | list[Output]:
        """Queue the graph under the job's id (unless it is already there)."""
        prompt_id = request.job
        if not prompt_id:
            raise failed()
        if await self._known(prompt_id):
            return prompt_id  # a re-delivery: poll what is already queued or run
        self._watch(prompt_id)  # listening before queuing: no event is missed
        reference = None
        if request.reference is not None and "reference" in request.inputs:
            reference = await self._upload(prompt_id, request.reference)
        body = {
            "prompt": graph_of(request, reference),
            "client_id": prompt_id,
            "prompt_id": prompt_id,
        }
        answer = await self.http.call("POST", "/prompt", json=body)
        if not answer.ok:
            raise http_fault(answer)
        queued = answer.json()
        if not isinstance(queued, dict) or queued.get("prompt_id") != prompt_id:
            raise failed()
        return prompt_id

    async def _known(self, prompt_id: str) -> bool:
        """Tell whether ComfyUI already has the prompt (queued, running or run)."""
        if await self._history(prompt_id) is not None:
            return True
        answer = await self.http.call("GET", "/queue")
        if not answer.ok:
            raise http_fault(answer)
        queue = answer.json()
        if not isinstance(queue, dict):
            raise failed()
        items = [*queue.get("queue_running", []), *queue.get("queue_pending", [])]
        return any(
            isinstance(item, list) and len(item) > 1 and item[1] == prompt_id
            for item in items
        )

    async def _upload(self, prompt_id: str, image: bytes) -> str:
        """Upload the reference into ComfyUI's input folder; return its name."""
        extension = sniff(image)
        if extension not in MEDIA_TYPES:
            raise failed()
        form = aiohttp.FormData()
        form.add_field(
            "image", image, filename=f"{prompt_id}.{extension}",
            content_type=MEDIA_TYPES[extension],
        )  # fmt: skip
        form.add_field("type", "input")
        form.add_field("overwrite", "true")
        answer = await self.http.call("POST", "/upload/image", data=form)
        if not answer.ok:
            raise http_fault(answer)
        uploaded = answer.json()
        name = uploaded.get("name") if isinstance(uploaded, dict) else None
        if not isinstance(name, str) or not name:
            raise failed()
        subfolder = uploaded.get("subfolder")
        return (
            f"{subfolder}/{name}" if isinstance(subfolder, str) and subfolder else name
        )

    async def _history(self, prompt_id: str) -> dict[str, Any] | None:
        """The prompt's history entry (None: not run yet)."""
        answer = await self.http.call("GET", f"/history/{quote(prompt_id, safe='')}")
        if not answer.ok:
            raise http_fault(answer)
        history = answer.json()
        if not isinstance(history, dict):
            raise failed()
        entry = history.get(prompt_id)
        if entry is not None and not isinstance(entry, dict):
            raise failed()
        return entry

    async def poll(self, request: Request, task: str) -> Polled:
        """Read the history; until it has the prompt, the websocket's progress."""
        watch = self._watch(task)
        entry = await self._history(task)
        if entry is None:
            if watch.fraction is None:
                return Polled("waiting")
            return Polled("running", watch.fraction)
        status = entry.get("status")
        if not isinstance(status, dict):
            raise failed()
        if status.get("status_str") == "error":
            self._unwatch(task)
            return Polled("failed")
        if not status.get("completed"):
            return Polled("running", watch.fraction)
        self._unwatch(task)
        return Polled("succeeded", results=self._files(entry.get("outputs")))

    def _files(self, outputs: Any) -> tuple[str, ...]:
        """The /view URLs of the run's output files, node by node."""
        if not isinstance(outputs, dict):
            raise failed()
        urls = []
        for node in sorted(outputs, key=str):
            produced = outputs[node]
            for key in FILE_KEYS:
                files = produced.get(key) if isinstance(produced, dict) else None
                for file in files if isinstance(files, list) else []:
                    if not isinstance(file, dict) or file.get("type") != "output":
                        continue
                    query = urlencode(
                        {
                            "filename": str(file.get("filename", "")),
                            "subfolder": str(file.get("subfolder", "")),
                            "type": "output",
                        }
                    )
                    urls.append(f"{self.http.base_url}/view?{query}")
        return tuple(urls)

    async def cancel(self, task: str) -> None:
        """Drop it from the queue, and interrupt it if it is the one running."""
        self._unwatch(task)
        with contextlib.suppress(UpstreamError):
            await self.http.call("POST", "/queue", json={"delete": [task]})
        with contextlib.suppress(UpstreamError):
            await self.http.call("POST", "/interrupt", json={"prompt_id": task})

    def _watch(self, prompt_id: str) -> Watch:
        """The prompt's listener, started (again, after a restart) if needed."""
        watch = self._watches.get(prompt_id)
        if watch is None:
            watch = self._watches[prompt_id] = Watch()
        if watch.task is None or watch.task.done():
            watch.task = asyncio.create_task(
                self._listen(prompt_id, watch), name=f"comfyui-ws-{prompt_id}"
            )
        return watch

    def _unwatch(self, prompt_id: str) -> None:
        watch = self._watches.pop(prompt_id, None)
        if watch is not None and watch.task is not None:
            watch.task.cancel()

    async def _listen(self, prompt_id: str, watch: Watch) -> None:
        """Follow the prompt's events; reconnect (same clientId) when cut off."""
        url = f"{self.http.base_url}/ws?clientId={quote(prompt_id, safe='')}"
        while True:
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with self.http.session.ws_connect(url, heartbeat=30.0) as ws:
                    async for message in ws:
                        if message.type != aiohttp.WSMsgType.TEXT:
                            continue  # binary frames are previews
                        if _heard(message.data, prompt_id, watch):
                            return
            await asyncio.sleep(RECONNECT_SECONDS)

    async def aclose(self) -> None:
        """Stop every listener, then close the session."""
        for prompt_id in list(self._watches):
            self._unwatch(prompt_id)
        await self.http.aclose()


def _heard(text: str, prompt_id: str, watch: Watch) -> bool:
    """Take one event in; tell whether the prompt has ended."""
    try:
        event = json.loads(text)
    except ValueError:
        return False
    data = event.get("data") if isinstance(event, dict) else None
    if not isinstance(data, dict) or data.get("prompt_id") != prompt_id:
        return False
    if event.get("type") == "progress":
        value, most = data.get("value"), data.get("max")
        if (
            isinstance(value, int | float)
            and isinstance(most, int | float)
            and most > 0
        ):
            watch.fraction = min(max(value / most, 0.0), 1.0)
    return event.get("type") in ENDED


def upstream(config: UpstreamSettings) -> TaskUpstream:
    """The `comfyui` upstream: a ComfyUI server in the shared task shape."""
    return TaskUpstream(ComfyApi(config))
