"""The public surface's keys: what every page is rendered with, and served as."""

from __future__ import annotations

from typing import Any, Final

from aiohttp import web

from .headers import SecurityHeaders
from .published import Published
from .representation import Representation

SECURITY: Final = web.AppKey("security", SecurityHeaders)
# The public documents as served today, re-rendered when a model retires.
PUBLISHED: Final = web.AppKey("published", Published)
# What every template is rendered with (site, base URL, stylesheet, models, ...).
TEMPLATE_CONTEXT: Final = web.AppKey("template_context", dict[str, Any])
# The rendered error pages outside /api, by status (404, 405).
ERROR_PAGES: Final = web.AppKey("error_pages", dict[int, Representation])
