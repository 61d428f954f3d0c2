"""A public page per published work, so a shared link previews and opens."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Final
from urllib.parse import urljoin

import jinja2
from aiohttp import web

from ..keys import CONTENT, SETTINGS
from ..web.headers import SecurityHeaders
from .feed import SQUARE, Work

# The workbench, where a visitor browses the square and makes their own.
WORKBENCH_PATH: Final = "/studio"
_CACHE_SIZE: Final = 512


def work_page_handler(
    env: jinja2.Environment,
    context: dict[str, Any],
    security: SecurityHeaders,
    not_found: web.Response,
) -> Any:
    """Serve /square/{id}: HTML rendered once per version of a work's record."""
    template = env.get_template("work.html")
    rendered: OrderedDict[bytes, bytes] = OrderedDict()
    headers = {
        "Content-Type": "text/html; charset=utf-8",
        "Cache-Control": "public, max-age=10",
        **security.for_type("text/html"),
    }

    async def page(request: web.Request) -> web.StreamResponse:
        work_id = request.match_info["work_id"]
        app = request.app
        body = (
            await app[SQUARE].work_json(work_id)
            if work_id.isascii() and work_id.isalnum()
            else None
        )
        if body is None:
            return web.Response(
                status=404, body=not_found.body, headers=not_found.headers
            )
        html = rendered.get(body)
        if html is None:
            work = Work.from_json(json.loads(body))
            base = app[SETTINGS].base_url
            names = {m.id: m.name for m in app[CONTENT].models}
            html = template.render(
                **context,
                doc={"lang": "zh-Hans", "path": f"/square/{work.id}"},
                work=work,
                title=_title(work.prompt),
                model_name=names.get(work.model, work.model),
                workbench=WORKBENCH_PATH,
                absolute=lambda url: urljoin(base + "/", url),
            ).encode()
            rendered[body] = html
            if len(rendered) > _CACHE_SIZE:
                rendered.popitem(last=False)
        return web.Response(body=html, headers=headers)

    return page


def _title(prompt: str) -> str:
    return prompt if len(prompt) <= 60 else prompt[:59] + "…"
