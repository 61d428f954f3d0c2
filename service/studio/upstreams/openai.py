"""The `openai` protocol: the Images API of OpenAI and of any provider speaking it.

One request, `POST {base_url}/v1/images/generations`, answers with the images
(no job to poll, so no progress in between and nothing to cancel upstream: a
canceled job just drops the connection). GPT Image models answer base64 and
take `output_format`; the older DALL·E models and most compatible providers
take `response_format` and may answer URLs, which are downloaded through
fetch.py. The API has no negative prompt, seed or reference image on this
endpoint, so submit refuses those fields for models on this protocol.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ...content import Model
from ...settings import UpstreamSettings
from .base import Output, Progress, Request, UpstreamError
from .fetch import decode_base64, fetch_result
from .http import Answer, UpstreamHttp, error_code, failed, http_fault

PATH: Final = "/v1/images/generations"
# error.code of a 400 that means the prompt was refused by the safety system.
BLOCKED_CODES: Final = frozenset({"content_policy_violation", "moderation_blocked"})


def refused_field(model: Model, asked: Mapping[str, Any]) -> str | None:
    """Name the first field of a submit this API cannot honour (None: all fine).

    The same for every model: the Images API takes none of these fields.
    """
    negative = asked.get("negative_prompt", "")
    if isinstance(negative, str) and negative.strip():
        return "negative_prompt"
    for name in ("seed", "reference"):
        if name in asked:
            return name
    return None


def fault(answer: Answer) -> UpstreamError:
    """Map a non-2xx answer exactly as CONTRACT §7 says for this protocol."""
    if answer.status == 400 and error_code(answer) in BLOCKED_CODES:
        return UpstreamError("CONTENT_BLOCKED", transient=False)
    return http_fault(answer)


class OpenAIUpstream:
    """Generate images through an OpenAI-style Images API."""

    def __init__(self, config: UpstreamSettings) -> None:
        self._http = UpstreamHttp(
            config.base_url, config.api_key, scheme="Bearer", timeout=config.timeout
        )

    def __repr__(self) -> str:
        return f"OpenAIUpstream({self._http.base_url!r})"

    async def generate(self, request: Request, progress: Progress) -> list[Output]:
        """Ask for `count` images of the size; decode or download each."""
        if request.kind != "image":
            raise failed()  # no video on this protocol (CONTRACT §7)
        body: dict[str, Any] = {
            "model": request.upstream_model,
            "prompt": request.prompt,
            "n": request.count,
            "size": f"{request.width}x{request.height}",
        }
        if request.upstream_model.startswith("gpt-image"):
            body["output_format"] = "png"  # GPT Image models always answer base64
        else:
            body["response_format"] = "b64_json"
        answer = await self._http.call("POST", PATH, json=body)
        if not answer.ok:
            raise fault(answer)
        items = _items(answer.json(), request.count)
        await progress(0.8)
        outputs = []
        for item in items:
            if "b64_json" in item:
                outputs.append(decode_base64(item["b64_json"], "image"))
            elif isinstance(item.get("url"), str):
                outputs.append(await fetch_result(self._http, item["url"], "image"))
            else:
                raise failed()
        return outputs

    async def aclose(self) -> None:
        """Close the session."""
        await self._http.aclose()


def _items(payload: Any, count: int) -> list[dict[str, Any]]:
    """The answer's `data`: as many images as were asked for (and paid), or fail."""
    data = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(data, list) or len(data) < count:
        raise failed()
    items = data[:count]
    if not all(isinstance(item, dict) for item in items):
        raise failed()
    return items


def upstream(config: UpstreamSettings) -> OpenAIUpstream:
    """Build the adapter of one upstream speaking this protocol."""
    return OpenAIUpstream(config)
