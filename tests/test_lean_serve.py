"""`serve` loads only what serving uses: media encoders and vendor SDKs stay out.

The real `python -m service serve` is started, answers a few requests, and is
then asked what it loaded: the interpreter's own import log (the
PYTHONPROFILEIMPORTTIME variable: every module, pure Python ones included)
and the shared objects its address space maps (/proc/PID/maps). Modules that
only workers or a configured feature use must be in neither.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Final

import pytest

from service.store.embedded import RedisServer

from .conftest import TEST_SECRET
from .ports import free_port
from .processes import output_of, running

# Modules `serve` must not load: name (or dotted prefix) -> who uses it instead.
# Extend this as workers or optional features gain dependencies. (pyahocorasick
# and opencc are serve's own: it checks every prompt before charging, CONTRACT §11.)
NOT_IN_SERVE: Final = {
    "av": "PyAV: workers encode video",
    "PIL": "Pillow: workers draw and re-encode; serve only on its first upload",
    "obstore": "the S3 media store, loaded only when a bucket is configured",
    "cryptography.hazmat": "payment signatures, only with a real channel set",
    "jwt": "Kling's request tokens: workers call vendors",
    "segno": "payment QR codes, drawn on the first QR request",
    "c2pa": "AIGC content credentials, written by workers",
    "fontTools": "AIGC visible labels, drawn by workers",
    "bs4": "HTML to Markdown, converted by a child process at render time",
    "markdownify": "HTML to Markdown, converted by a child process at render time",
    "lxml": "bs4's optional parser, loaded by bs4 where it is installed",
    "prometheus_client": "metrics, counted only with a listener (metrics.port)",
    "service.studio.upstreams.kling": "vendor adapters: serve routes, workers call",
    "service.moderation.providers.aliyun": "a cloud moderation API, only if chosen",
    "service.account.archive": "the export ZIP's writer: workers build exports",
    "service.account.purger": "the purge of deleted accounts: workers run it",
}
# The shared objects those packages bring, as /proc/PID/maps shows them.
NATIVE: Final = {
    "av": re.compile(r"/av/|libavcodec"),
    "PIL": re.compile(r"/PIL/"),
    "obstore": re.compile(r"/obstore/"),
    "cryptography.hazmat": re.compile(r"/cryptography/hazmat/bindings/"),
    "c2pa": re.compile(r"/c2pa/|libc2pa"),
    "lxml": re.compile(r"/lxml/"),
}
_IMPORT_LINE: Final = re.compile(
    r"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", re.MULTILINE
)
PATHS: Final = ["/", "/en", "/api-docs", "/llms.txt", "/api/models", "/api/square"]


def _loaded(variables: Mapping[str, str]) -> tuple[set[str], str]:
    """Start `serve`, request PATHS, return its imported modules and its maps."""
    with running("serve", {**variables, "PYTHONPROFILEIMPORTTIME": "1"}) as (
        base,
        process,
    ):
        for path in PATHS:
            with urllib.request.urlopen(base + path, timeout=10) as response:
                assert response.status == 200, path
        maps = Path(f"/proc/{process.pid}/maps").read_text()
        modules = set(_IMPORT_LINE.findall(output_of(process).text()))
    assert "service.app" in modules, "the import log was not read"
    return modules, maps


def _found(name: str, modules: set[str], maps: str) -> list[str]:
    """Return the evidence that `name` is loaded (empty: it is not)."""
    found = sorted(m for m in modules if m == name or m.startswith(name + "."))
    native = NATIVE.get(name)
    if native is not None and native.search(maps):
        found.append(f"{name}: a shared object is mapped")
    return found


@pytest.fixture
def variables(redis_server: RedisServer) -> dict[str, str]:
    """A production-like `serve`: demo upstream and a Kling key, no bucket."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_UPSTREAMS_KLING_API_KEY": "access:secret",
    }


def test_serve_loads_no_media_encoder_vendor_sdk_or_payment_crypto(
    variables: dict[str, str],
) -> None:
    """After start-up and a few public and /api requests, none of NOT_IN_SERVE."""
    modules, maps = _loaded(variables)
    loaded = {name: _found(name, modules, maps) for name in NOT_IN_SERVE}
    assert not {name: found for name, found in loaded.items() if found}


def test_a_configured_bucket_is_the_one_reason_serve_loads_obstore(
    variables: dict[str, str],
) -> None:
    """The check can fail: with STUDIO_MEDIA_S3_* set, obstore shows in both."""
    unreachable = f"http://127.0.0.1:{free_port()}"
    modules, maps = _loaded(
        {
            **variables,
            "STUDIO_MEDIA_S3_ENDPOINT": unreachable,
            "STUDIO_MEDIA_S3_BUCKET": "media",
            "STUDIO_MEDIA_S3_ACCESS_KEY_ID": "key",
            "STUDIO_MEDIA_S3_SECRET_ACCESS_KEY": "secret-secret",
        }
    )
    found = _found("obstore", modules, maps)
    assert "obstore" in found
    assert "obstore: a shared object is mapped" in found
    assert not _found("av", modules, maps)
