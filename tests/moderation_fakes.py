"""Fake moderation providers on loopback that check each one's signing as it does.

Tencent TMS/IMS (TC3-HMAC-SHA256), Alibaba Cloud Content Security 2.0
(ACS3-HMAC-SHA256) and Volcengine BusinessSecurity (HMAC-SHA256, V4). Each
signature is verified from the request as received (method, path, query, the
signed headers, the body's hash), written here from the vendor's documentation
and not from service/: the official SDKs' requests pass them
(tests/test_moderation_providers.py); a request signed with another secret, an
altered body or a stale timestamp fails with the vendor's own error shape.
Alibaba's and Volcengine's image checks fetch the URL they are given, as those
vendors do.
"""

from __future__ import annotations

import abc
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
from typing import Any, ClassVar, Self
from urllib.parse import parse_qsl, quote

import aiohttp
from aiohttp import web
from PIL import Image

from .ports import free_port

SECRET_ID = "AKIDfake0123456789abcdefghijklmn"
SECRET_KEY = "fake-secret-key-0123456789abcdef"
ACTIONS = {"TextModeration": "tms", "ImageModeration": "ims"}
APP_ID = "5120001"
# The actions Volcengine's fake serves: their version and body's Service.
VOLCENGINE_ACTIONS = {
    "TextSliceRisk": ("2022-11-07", "text_risk"),
    "ImageContentRiskV2": ("2021-11-29", "image_content_risk"),
}
# The headers Alibaba's V3 signature must cover (besides any others signed).
ACS3_SIGNED = {
    "host", "x-acs-action", "x-acs-version", "x-acs-date", "x-acs-signature-nonce",
    "x-acs-content-sha256",
}  # fmt: skip


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


def _authorization(request: web.Request, algorithm: str) -> dict[str, str] | None:
    """The Authorization header's Name=value parts, if it names the algorithm."""
    named, _, rest = request.headers.get("Authorization", "").partition(" ")
    if named != algorithm:
        return None
    return dict(item.strip().split("=", 1) for item in rest.split(",") if "=" in item)


def _canonical(request: web.Request, signed: list[str], body: bytes) -> str:
    """The canonical request of a request as received (ACS3 and V4 alike)."""
    query = "&".join(
        f"{quote(key, safe='-_.~')}={quote(request.query[key], safe='-_.~')}"
        for key in sorted(request.query)
    )
    values = {name: sorted(request.headers.getall(name, [])) for name in signed}
    headers = "".join(
        f"{name}:{','.join(v.strip() for v in values[name])}\n" for name in signed
    )
    return "\n".join(
        [
            request.method,
            request.path,
            query,
            headers,
            ";".join(signed),
            hashlib.sha256(body).hexdigest(),
        ]
    )


def verify_acs3(request: web.Request, body: bytes, secret: str) -> str | None:
    """Return why a request's ACS3-HMAC-SHA256 signature is wrong, or None."""
    parts = _authorization(request, "ACS3-HMAC-SHA256")
    if parts is None:
        return "algorithm"
    if parts.get("Credential") != SECRET_ID:
        return "access key id"
    signed = parts.get("SignedHeaders", "").split(";")
    if not set(signed) >= ACS3_SIGNED or signed != sorted(signed):
        return "signed headers"
    if request.headers.get("x-acs-content-sha256") != hashlib.sha256(body).hexdigest():
        return "content hash"
    try:
        stamp = dt.datetime.strptime(
            request.headers.get("x-acs-date", ""), "%Y-%m-%dT%H:%M:%SZ"
        ).replace(tzinfo=dt.UTC)
    except ValueError:
        return "date"
    if abs(time.time() - stamp.timestamp()) > 900:
        return "date"
    canonical = _canonical(request, signed, body)
    string = "ACS3-HMAC-SHA256\n" + hashlib.sha256(canonical.encode()).hexdigest()
    expected = hmac.new(secret.encode(), string.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("Signature", "")):
        return "signature"
    return None


def verify_volc_v4(request: web.Request, body: bytes, secret: str) -> str | None:
    """Return why a request's Volcengine V4 signature is wrong, or None."""
    parts = _authorization(request, "HMAC-SHA256")
    if parts is None:
        return "algorithm"
    credential = parts.get("Credential", "").split("/")
    if len(credential) != 5 or credential[0] != SECRET_ID:
        return "credential"
    _, day, region, service, tail = credential
    if (service, tail) != ("BusinessSecurity", "request"):
        return "scope"
    signed = parts.get("SignedHeaders", "").split(";")
    if not {"x-date", "x-content-sha256"} <= set(signed):
        return "signed headers"
    if request.headers.get("X-Content-Sha256") != hashlib.sha256(body).hexdigest():
        return "content hash"
    stamp = request.headers.get("X-Date", "")
    try:
        moment = dt.datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return "date"
    if abs(time.time() - moment.timestamp()) > 900 or stamp[:8] != day:
        return "date"
    canonical = _canonical(request, signed, body)
    scope = f"{day}/{region}/{service}/request"
    string = "\n".join(
        ["HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = secret.encode()
    for part in (day, region, service, "request"):
        key = _sign(key, part)
    expected = hmac.new(key, string.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(expected, parts.get("Signature", "")):
        return "signature"
    return None


@dataclass
class FakeProvider(abc.ABC):
    """A provider on one loopback port; what it answers is set by the test."""

    name: ClassVar[str]
    text_action: ClassVar[str]
    image_action: ClassVar[str]
    # The labels a refusal is logged with ("provider:Label").
    text_label: ClassVar[str]
    image_label: ClassVar[str]
    # Its verdict for "a person should look" (which lets content through).
    review: ClassVar[str]

    blocked_words: set[str] = field(default_factory=set)
    block_images: bool = False
    # Refuse only the image checked in this place (1: the first), when set.
    block_image_at: int = 0
    # The image verdict's raw word instead (a middle one, an unknown one).
    image_verdict: str = ""
    hang_images: bool = False
    requests: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    # The image URLs it fetched (the providers that take images by URL).
    fetched: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self._runner: web.AppRunner | None = None
        self._released = asyncio.Event()

    async def __aenter__(self) -> Self:
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

    def texts(self) -> int:
        """Count the well-signed text checks."""
        return self.actions(self.text_action)

    def images(self) -> int:
        """Count the well-signed image checks."""
        return self.actions(self.image_action)

    def hit(self, text: str) -> str | None:
        """The blocked word a text contains, if any."""
        return next((w for w in self.blocked_words if w in text), None)

    async def fetch(self, url: str) -> bytes | None:
        """Fetch an image by URL as the vendor does (7 s at most); None if it fails."""
        self.fetched.append(url)
        try:
            async with (
                aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=7)) as http,
                http.get(url) as reply,
            ):
                reply.raise_for_status()
                return await reply.read()
        except (aiohttp.ClientError, TimeoutError):
            return None

    def refuses(self) -> bool:
        """Tell whether the image check being answered is refused."""
        return self.block_images or self.images() == self.block_image_at

    async def looked_at(self, data: bytes) -> None:
        """Decode the image (a real one, or this fails loudly); hang if told to."""
        Image.open(io.BytesIO(data)).verify()
        if self.hang_images:
            await self._released.wait()  # until the fake stops

    @abc.abstractmethod
    async def _handle(self, request: web.Request) -> web.StreamResponse:
        """Check the signing, record the call, answer in the provider's shape."""


class FakeTencent(FakeProvider):
    """TMS and IMS: TC3 in the headers, JSON in and out."""

    name = "tencent"
    text_action = "TextModeration"
    image_action = "ImageModeration"
    text_label = image_label = "tencent:Porn"
    review = "Review"

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
            hit = self.hit(base64.b64decode(params["Content"]).decode("utf-8"))
            suggestion, label = ("Block", "Porn") if hit else ("Pass", "Normal")
            return self._answer(
                {
                    "Suggestion": suggestion,
                    "Label": label,
                    "Keywords": [hit] if hit else [],
                }
            )
        data = base64.b64decode(params["FileContent"])
        await self.looked_at(data)
        blocked = self.refuses()
        suggestion, label = ("Block", "Porn") if blocked else ("Pass", "Normal")
        return self._answer(
            {
                "Suggestion": self.image_verdict or suggestion,
                "Label": label,
                "SubLabel": "",
                "Score": 97 if blocked else 0,
                "FileMD5": hashlib.md5(data).hexdigest(),
            }
        )


class FakeAliyun(FakeProvider):
    """Content Security 2.0: ACS3 in the headers, a form in, JSON out; fetches URLs."""

    name = "aliyun"
    text_action = "TextModerationPlus"
    image_action = "ImageModeration"
    text_label = "aliyun:pornographic_adult"
    image_label = "aliyun:pornographic_adultContent"
    review = "medium"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._nonces: set[str] = set()

    @staticmethod
    def _answer(body: dict[str, Any], status: int = 200) -> web.Response:
        body.setdefault("RequestId", secrets.token_hex(8).upper())
        return web.json_response(body, status=status)

    def _fault(self, status: int, code: str, message: str) -> web.Response:
        self.refused.append(code)
        return self._answer({"Code": code, "Message": message}, status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        wrong = verify_acs3(request, body, SECRET_KEY)
        if wrong is not None:
            self.refused.append(wrong)
            return self._answer(
                {
                    "Code": "SignatureDoesNotMatch",
                    "Message": "Specified signature is not matched with our"
                    f" calculation ({wrong}).",
                },
                400,
            )
        nonce = request.headers["x-acs-signature-nonce"]
        if nonce in self._nonces:
            return self._fault(400, "SignatureNonceUsed", "nonce used")
        self._nonces.add(nonce)
        if request.headers["x-acs-version"] != "2022-03-02":
            return self._fault(400, "InvalidVersion", "Specified parameter Version")
        action = request.headers["x-acs-action"]
        form = {**request.query, **dict(parse_qsl(body.decode()))}
        params = {**form, "ServiceParameters": json.loads(form["ServiceParameters"])}
        self.requests.append((action, params))
        if action == "TextModerationPlus":
            hit = self.hit(params["ServiceParameters"]["content"])
            return self._verdict(hit is not None, self.text_label, hit or "")
        if action != "ImageModeration":
            return self._fault(404, "InvalidAction.NotFound", action)
        data = await self.fetch(params["ServiceParameters"]["imageUrl"])
        if data is None:
            return self._answer({"Code": 408, "Message": "download image failed"})
        await self.looked_at(data)
        return self._verdict(self.refuses(), self.image_label, "", self.image_verdict)

    def _verdict(
        self, blocked: bool, label: str, words: str, level: str = ""
    ) -> web.Response:
        found = {"Label": label.partition(":")[2], "Confidence": 97.5}
        if words:
            found["RiskWords"] = words
        clean = {"Label": "nonLabel", "Description": "未检测出风险"}
        data = {
            "DataId": secrets.token_hex(6),
            "RiskLevel": level or ("high" if blocked else "none"),
            "Result": [found if blocked else clean],
        }
        return self._answer({"Code": 200, "Data": data, "Message": "OK"})


class FakeVolcengine(FakeProvider):
    """BusinessSecurity: V4 in the headers, the action in the query, JSON in and out."""

    name = "volcengine"
    text_action = "TextSliceRisk"
    image_action = "ImageContentRiskV2"
    text_label = "volcengine:porn"
    image_label = "volcengine:porn"
    review = "REVIEW"

    @staticmethod
    def _answer(action: str, body: dict[str, Any], status: int = 200) -> web.Response:
        meta = {
            "RequestId": secrets.token_hex(12), "Action": action,
            "Version": VOLCENGINE_ACTIONS.get(action, ("",))[0],
            "Service": "BusinessSecurity", "Region": "cn-north-1",
        }  # fmt: skip
        if "Error" in body:
            meta["Error"] = body.pop("Error")
        return web.json_response({"ResponseMetadata": meta, **body}, status=status)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        action = request.query.get("Action", "")
        wrong = verify_volc_v4(request, body, SECRET_KEY)
        if wrong is not None:
            self.refused.append(wrong)
            error = {
                "CodeN": 100010,
                "Code": "SignatureDoesNotMatch",
                "Message": f"The request signature does not match ({wrong})",
            }
            return self._answer(action, {"Error": error}, 401)
        version, service = VOLCENGINE_ACTIONS.get(action, ("", ""))
        payload = json.loads(body)
        if request.query.get("Version") != version or payload.get("Service") != service:
            self.refused.append("action")
            error = {
                "CodeN": 100008,
                "Code": "InvalidActionOrVersion",
                "Message": action,
            }
            return self._answer(action, {"Error": error}, 404)
        if payload.get("AppId") != int(APP_ID):
            return self._answer(action, {"Result": {"Code": 60004, "Message": "AppId"}})
        params = {**payload, "Parameters": json.loads(payload["Parameters"])}
        self.requests.append((action, params))
        if action == "TextSliceRisk":
            hit = self.hit(params["Parameters"]["text"])
            return self._verdict(action, hit is not None)
        data = await self.fetch(params["Parameters"]["url"])
        if data is None:
            return self._answer(action, {"Result": {"Code": 60006, "Message": "url"}})
        await self.looked_at(data)
        return self._verdict(action, self.refuses(), self.image_verdict)

    def _verdict(self, action: str, blocked: bool, decision: str = "") -> web.Response:
        data: dict[str, Any] = {
            "DataId": secrets.token_hex(6),
            "Decision": decision or ("BLOCK" if blocked else "PASS"),
            "DecisionDetail": "",
            "FinalLabel": "porn" if blocked else "",
            "Results": [],
        }
        result = {"RequestId": secrets.token_hex(12), "Code": 0, "Message": "Success"}
        return self._answer(action, {"Result": {**result, "Data": data}})


FAKES: dict[str, type[FakeProvider]] = {
    fake.name: fake for fake in (FakeTencent, FakeAliyun, FakeVolcengine)
}
