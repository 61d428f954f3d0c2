"""The template environment: the same in `serve` and in its rendering child."""

from __future__ import annotations

import functools
from typing import Final

import jinja2

from ..settings import resource_dir

TEMPLATES_DIR: Final = resource_dir("templates")


@functools.cache
def environment() -> jinja2.Environment:
    """One environment per process: every app shares its compiled templates."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        autoescape=jinja2.select_autoescape(("html", "xml")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
