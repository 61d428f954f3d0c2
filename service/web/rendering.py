"""Render pages from their templates, with their Markdown twins, in a child.

`serve` renders its documents and machine files only at start-up and at a
retirement midnight, yet compiling their templates leaves about 2 MB of freed
memory its heap keeps for as long as it runs, and the Markdown converter
(html_markdown.py) would cost it 5 to 9 MB more. So `render_pages` runs this
module as `python -m service.web.rendering`: the pages pickled on stdin (the
child is this same package), and on stdout {"pages": [[text, markdown], ...]},
or {"broken": "why"} for a document that breaks a rule.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .templates import environment

# The directory `service` sits in: where the child finds this package.
_PACKAGE_ROOT: Final = Path(__file__).resolve().parents[2]
_CHILD_SECONDS: Final = 120.0
# Digest of a page -> what the child answered, oldest first; two editions fit.
_RENDERED: dict[bytes, tuple[str, str | None]] = {}
_CACHE_SIZE: Final = 64


@dataclass(frozen=True, slots=True)
class Page:
    """A template to render with its context; with a URL, a document to convert."""

    template: str
    context: Mapping[str, Any]
    markdown_url: str | None = None  # the page's address, for absolute links


def render_pages(pages: Sequence[Page]) -> list[tuple[str, str | None]]:
    """Return each page's text and Markdown (None: not asked), from one child.

    A page rendered before unchanged (another edition, another app in the
    process) is answered from memory. A document that breaks a rule raises
    ValueError with the child's one line; a child that fails, RuntimeError.
    """
    digests = [hashlib.sha256(_pickled(page)).digest() for page in pages]
    known = {d: _RENDERED[d] for d in digests if d in _RENDERED}
    missing = {d: p for d, p in zip(digests, pages, strict=True) if d not in known}
    if missing:
        answer = _child(list(missing.values()))
        if "broken" in answer:
            raise ValueError(answer["broken"])
        known |= {
            digest: (text, markdown)
            for digest, (text, markdown) in zip(missing, answer["pages"], strict=True)
        }
        _RENDERED.update(known)
        while len(_RENDERED) > _CACHE_SIZE:
            del _RENDERED[next(iter(_RENDERED))]
    return [known[d] for d in digests]


def _pickled(value: object) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def _child(pages: list[Page]) -> Any:
    """Run the child on `pages`; return its parsed answer."""
    child = subprocess.run(
        [sys.executable, "-m", "service.web.rendering"],
        input=_pickled(pages),
        capture_output=True,
        cwd=_PACKAGE_ROOT,
        timeout=_CHILD_SECONDS,
        check=False,
    )
    if child.returncode != 0:
        raise RuntimeError(
            f"the page renderer exited {child.returncode}: "
            + child.stderr.decode(errors="replace")[-2000:]
        )
    return json.loads(child.stdout)


def main() -> None:
    """Render the pickled pages from stdin; answer on stdout."""
    from .html_markdown import html_to_markdown  # the child's alone

    pages: list[Page] = pickle.loads(sys.stdin.buffer.read())  # from our parent
    env = environment()
    answer: dict[str, Any]
    try:
        rendered = []
        for page in pages:
            text = env.get_template(page.template).render(**page.context)
            url = page.markdown_url
            rendered.append((text, html_to_markdown(text, url) if url else None))
        answer = {"pages": rendered}
    except ValueError as err:
        answer = {"broken": str(err)}
    sys.stdout.buffer.write(json.dumps(answer, ensure_ascii=False).encode())


if __name__ == "__main__":
    main()
