"""The browser workbench: /studio and its files, prepared once at start-up.

The page is one template rendered at start-up; its scripts and stylesheet are
files of `service/static/studio/`, served from memory under a path that carries a hash
of all of them (`/static/studio/<version>/app.js`). Every URL therefore names
exactly one content and is cached for a year as immutable, while the page that
names them is revalidated on each visit (`no-cache` + ETag, a 304 costs nothing).
One version for the whole folder, rather than a hash per file, keeps the ES
modules' relative imports (`./api.js`) working with no build step.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import jinja2
from aiohttp import web
from aiohttp.typedefs import Handler

from ..keys import SETTINGS
from .documents import HTML_TYPE
from .headers import SecurityHeaders
from .representation import Representation, prepare, respond

# Inside the package, beside templates/, so an installed wheel carries them.
STATIC_DIR: Final = Path(__file__).resolve().parent.parent / "static" / "studio"
STATIC_PREFIX: Final = "/static/studio"
STUDIO_PATH: Final = "/studio"
# The entry module; the others are preloaded so the imports cost no round trips.
ENTRY: Final = "app.js"
STRINGS: Final = "strings.json"
_TYPES: Final = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_IMMUTABLE: Final = "public, max-age=31536000, immutable"
# A static file is never a document: if one is opened directly, it runs nothing.
_FILE_HEADERS: Final = {
    "Cache-Control": _IMMUTABLE,
    "Content-Security-Policy": "default-src 'none'; sandbox",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass(frozen=True, slots=True)
class Assets:
    """The workbench's files, prepared once, under one content version."""

    version: str
    files: Mapping[str, Representation]

    def url(self, name: str) -> str:
        """Return the immutable URL of one file."""
        if name not in self.files:
            raise KeyError(name)
        return f"{STATIC_PREFIX}/{self.version}/{name}"

    @property
    def modules(self) -> list[str]:
        """Return the URLs of every ES module, the entry first."""
        names = sorted(n for n in self.files if n.endswith(".js") and n != ENTRY)
        return [self.url(name) for name in (ENTRY, *names)]


def load_assets(directory: Path, security: SecurityHeaders) -> Assets:
    """Read every servable file once; the version is a hash of all of them."""
    found = sorted(
        path for path in directory.iterdir() if path.is_file() and path.suffix in _TYPES
    )
    digest = hashlib.sha256()
    files: dict[str, Representation] = {}
    for path in found:
        body = path.read_bytes()
        digest.update(path.name.encode() + b"\0" + body + b"\0")
        files[path.name] = prepare(
            body,
            _TYPES[path.suffix],
            _FILE_HEADERS,
            security=security,
            tag="s",
        )
    return Assets(version=digest.hexdigest()[:16], files=files)


def studio_csp(media_origin: str = "") -> str:
    """Allow our own scripts, styles, API and media, and nothing else.

    No inline script or style, no eval, and Trusted Types with no policy, so
    the browser itself refuses any string handed to innerHTML and the like.
    blob: shows a reference image before it is uploaded.
    """
    media = f"'self' {media_origin}".strip()
    return (
        "default-src 'none'; script-src 'self'; style-src 'self'; "
        f"img-src {media} blob:; media-src {media}; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'; "
        "require-trusted-types-for 'script'; trusted-types 'none'"
    )


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def _json_for_script(data: object) -> str:
    """Serialize for a <script type="application/json"> block: no `<` survives."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def render_studio(
    env: jinja2.Environment,
    context: Mapping[str, Any],
    assets: Assets,
    strings: Mapping[str, Mapping[str, str]],
) -> bytes:
    """Render the page once: Chinese text in place, both languages as data."""
    zh = strings["zh"]
    html = env.get_template("studio.html").render(
        **context,
        asset=assets.url,
        modules=assets.modules,
        t=lambda key: zh[key],
        strings_json=_json_for_script(strings),
    )
    return html.encode()


def _serve(rep: Representation) -> Handler:
    async def handler(request: web.Request) -> web.StreamResponse:
        return respond(request, rep)

    return handler


def _static_handler(assets: Assets) -> Handler:
    missing = {"X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"}

    async def handler(request: web.Request) -> web.StreamResponse:
        """Serve a file of the current version; any other path is a plain 404."""
        rep = assets.files.get(request.match_info["name"])
        if rep is None or request.match_info["version"] != assets.version:
            raise web.HTTPNotFound(headers=missing)
        return respond(request, rep)

    return handler


def setup_workbench_routes(
    app: web.Application,
    env: jinja2.Environment,
    context: Mapping[str, Any],
    security: SecurityHeaders,
) -> None:
    """Register GET /studio and /static/studio/<version>/<name>, all from memory."""
    assets = load_assets(STATIC_DIR, security)
    strings = json.loads((STATIC_DIR / STRINGS).read_text(encoding="utf-8"))
    media_origin = _origin(app[SETTINGS].workbench.media_public_url)
    page_security = SecurityHeaders(https=security.https, csp=studio_csp(media_origin))
    # The account view names the deletion's grace period before it starts.
    grace = {"grace_days": app[SETTINGS].account.grace_days}
    page = prepare(
        render_studio(env, {**context, **grace}, assets, strings),
        HTML_TYPE,
        {"Cache-Control": "no-cache"},
        security=page_security,
        tag="studio",
    )
    app.router.add_get(STUDIO_PATH, _serve(page), name="studio")
    app.router.add_get(
        STATIC_PREFIX + "/{version}/{name}",
        _static_handler(assets),
        name="studio_static",
    )
