"""Style presets: listed for Create, and applied to a prompt at submit."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ..api.boundary import ApiBoundary
from ..api.payloads import json_response
from ..api.query import bad_field
from ..auth.sessions import anonymous
from ..content import Model, Preset
from ..keys import CONTENT


@anonymous
async def list_presets(request: web.Request) -> web.StreamResponse:
    """List the presets with their names in the asked language (zh by default)."""
    lang = request.query.get("lang", "zh")
    if lang not in ("zh", "en"):
        raise bad_field("lang")
    presets = [
        {
            "id": preset.id,
            "name": preset.name_zh if lang == "zh" else preset.name_en,
            "prompt_suffix": preset.prompt_suffix,
            "negative_prompt": preset.negative_prompt,
        }
        for preset in request.app[CONTENT].presets
    ]
    return json_response({"presets": presets})


def with_preset(
    presets: tuple[Preset, ...],
    model: Model,
    body: Mapping[str, Any],
    prompt: str,
    negative: str,
) -> dict[str, str]:
    """Apply the body's `preset` (if any): the stored prompt and negative prompt.

    The person's own words are kept too (`base_*`), so "try again" applies the
    preset to them once more instead of to the already extended prompt.
    """
    if "preset" not in body:
        return {"prompt": prompt, "negative_prompt": negative}
    asked = body["preset"]
    chosen = next((p for p in presets if p.id == asked), None)
    if chosen is None:
        raise bad_field("preset")
    extra = chosen.negative_prompt if "negative_prompt" in model.fields else ""
    return {
        "prompt": f"{prompt}, {chosen.prompt_suffix}",
        "negative_prompt": ", ".join(part for part in (negative, extra) if part),
        "preset": chosen.id,
        "base_prompt": prompt,
        "base_negative_prompt": negative,
    }


def setup_preset_routes(api: ApiBoundary) -> None:
    """Register GET /api/presets behind the /api boundary."""
    api.add_routes([web.get("/presets", list_presets, name="presets")])
