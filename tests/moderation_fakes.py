"""A fake Tencent Cloud TMS/IMS on loopback that checks TC3-HMAC-SHA256 as Tencent does.

The signature is verified from the request as received (method, path, the
signed headers, the body's hash), written here from Tencent's API 3.0
documentation and not from service/: the official SDK's requests pass it
(tests/test_moderation_providers.py), a request signed with another secret, an
altered body or a stale timestamp fails with Tencent's own error shape.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import hashlib
import hmac
import io
import json
import secrets
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from aiohttp import web
from PIL import Image

from service.store.embedded import free_port

SECRET_ID = "AKIDfake0123456789abcdefghijklmn"
SECRET_KEY = "fake-secret-key-0123456789abcdef"
ACTIONS = {"TextModeration": "tms", "ImageModeration": "ims"}


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()


def verify_tc3(request_headers: Any, body: bytes, secret_key: str) -> str | None:
    """Return why a request's TC3 signature is wrong, or None if it is right."""
    auth = request_headers.get("Authorization", "")
    algorithm, _, rest = auth.partition(" ")
    if algorithm != "TC3-HMAC-SHA256":
        return "algorithm"
    parts = dict(item.strip().split("=", 1) for item in rest.split(","))
    credential = parts.get("Credential", "").split("/")
    if len(credential) != 4 or credential[3] != "tc3_request":
        return "credential"
    key_id, day, service, _ = credential
    if key_id != SECRET_ID:
        return "secret id"
    timestamp = int(request_headers.get("X-TC-Timestamp", "0"))
    if abs(time.time() - timestamp) > 300:
        return "timestamp"
    if dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d") != day:
        return "date"
    action = request_headers.get("X-TC-Action", "")
    if ACTIONS.get(action) != service:
        return "service"
    signed = parts.get("SignedHeaders", "").split(";")
    if "host" not in signed or "content-type" not in signed:
        return "signed headers"
    canonical_headers = "".join(
        f"{name}:{request_headers.get(name, '').strip().lower()}\n" for name in signed
    )
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            canonical_headers,
            ";".join(signed),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    string = "\n".join(
        [
            "TC3-HMAC-SHA256",
            str(timestamp),
            f"{day}/{service}/tc3_request",
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = _sign(
        _sign(_sign(("TC3" + secret_key).encode(), day), service), "tc3_request"
    )
    expected = hmac.new(key, string.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("Signature", "")):
        return "signature"
    return None


@dataclass
class FakeTencent:
    """TMS and IMS on one loopback port; what they answer is set by the test."""

    blocked_words: set[str] = field(default_factory=set)
    block_images: bool = False
    hang_images: bool = False
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None
        self._released = asyncio.Event()

    async def __aenter__(self) -> FakeTencent:
        app = web.Application(client_max_size=20 * 1024 * 1024)
        app.router.add_post("/", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._runner is not None
        self._released.set()
        await self._runner.cleanup()

    def actions(self, action: str) -> int:
        """Count the well-signed requests of one action."""
        return sum(1 for name, _ in self.requests if name == action)

    @staticmethod
    def _answer(body: dict[str, Any]) -> web.Response:
        body.setdefault("RequestId", secrets.token_hex(8))
        return web.json_response({"Response": body})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if not request.headers.get("Content-Type", "").startswith("application/json"):
            return self._answer({"Error": {"Code": "InvalidParameter"}})
        wrong = verify_tc3(request.headers, body, SECRET_KEY)
        if wrong is not None or request.headers.get("X-TC-Version") != "2020-12-29":
            self.refused.append(wrong or "version")
            return self._answer(
                {
                    "Error": {
                        "Code": "AuthFailure.SignatureFailure",
                        "Message": f"credentials could not be validated ({wrong})",
                    }
                }
            )
        action = request.headers["X-TC-Action"]
        params = json.loads(body)
        self.requests.append((action, params))
        if action == "TextModeration":
            text = base64.b64decode(params["Content"]).decode("utf-8")
            hit = next((w for w in self.blocked_words if w in text), None)
            suggestion, label = ("Block", "Porn") if hit else ("Pass", "Normal")
            return self._answer(
                {
                    "Suggestion": suggestion,
                    "Label": label,
                    "Keywords": [hit] if hit else [],
                }
            )
        data = base64.b64decode(params["FileContent"])
        Image.open(io.BytesIO(data)).verify()  # a real image, or this fails loudly
        if self.hang_images:
            await self._released.wait()  # until the fake stops
        suggestion, label = (
            ("Block", "Porn") if self.block_images else ("Pass", "Normal")
        )
        return self._answer(
            {
                "Suggestion": suggestion,
                "Label": label,
                "SubLabel": "",
                "Score": 97 if self.block_images else 0,
                "FileMD5": hashlib.md5(data).hexdigest(),
            }
        )
