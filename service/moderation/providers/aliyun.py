"""Alibaba Cloud Content Security 2.0 (内容安全增强版), signed ACS3-HMAC-SHA256 (V3).

Both calls are `POST /` to `green-cip.{region}.aliyuncs.com` (or
`moderation.endpoint`), RPC style, version 2022-03-02: the action and version
in `x-acs-action` / `x-acs-version` headers, `Service` and `ServiceParameters`
(a JSON text) in a form body, signed with the V3 signature Alibaba's current
SDKs send by default. Text goes to `TextModerationPlus` (service
`llm_query_moderation`, for prompts); an image to `ImageModeration` (service
`baselineCheck`) by its URL, which Alibaba fetches (it takes no image bytes).
The answer is `{"Code": 200, "Data": {"RiskLevel": "high"|"medium"|"low"|
"none", "Result": [{"Label": ...}]}}`, or another Code with a Message. `high`
refuses; `medium` (Alibaba: "route to human review") lets it through.
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
from collections.abc import Mapping
from typing import Final
from urllib.parse import urlencode, urlsplit

from .base import Picture, ProviderError, Verdict
from .http import KeyedClient, coded, decided, post_json
from .signing import canonical_request, hmac_hex, sha256_hex

VERSION: Final = "2022-03-02"
REGION: Final = "cn-shanghai"
TEXT_SERVICE: Final = "llm_query_moderation"
IMAGE_SERVICE: Final = "baselineCheck"
ALGORITHM: Final = "ACS3-HMAC-SHA256"
RISK_LEVELS: Final = ("high", "medium", "low", "none")


def authorization(
    *, access_key_id: str, secret: str, headers: Mapping[str, str], body: bytes
) -> str:
    """Sign a POST / with no query: every given header, lower-cased and sorted."""
    canonical, names = canonical_request({}, headers, body)
    signature = hmac_hex(secret.encode(), f"{ALGORITHM}\n{sha256_hex(canonical)}")
    return (
        f"{ALGORITHM} Credential={access_key_id},SignedHeaders={names},"
        f"Signature={signature}"
    )


class Aliyun(KeyedClient):
    """TextModerationPlus for text, ImageModeration (by URL) for images."""

    name = "aliyun"
    region = REGION

    @property
    def _url(self) -> str:
        return self._endpoint or f"https://green-cip.{self._region}.aliyuncs.com"

    async def text(self, content: str) -> Verdict:
        """TextModerationPlus of a prompt."""
        return await self._call(
            "TextModerationPlus", TEXT_SERVICE, {"content": content}
        )

    async def image(self, picture: Picture) -> Verdict:
        """ImageModeration of the image at its URL."""
        if not picture.url:
            raise ProviderError("aliyun ImageModeration: no URL for the image")
        parameters = {"imageUrl": picture.url, "dataId": secrets.token_hex(8)}
        return await self._call("ImageModeration", IMAGE_SERVICE, parameters)

    async def _call(
        self, action: str, service: str, parameters: Mapping[str, str]
    ) -> Verdict:
        body = urlencode(
            {
                "Service": service,
                "ServiceParameters": json.dumps(parameters, ensure_ascii=False),
            }
        ).encode()
        headers = {
            "host": urlsplit(self._url).netloc,
            "content-type": "application/x-www-form-urlencoded",
            "x-acs-action": action,
            "x-acs-version": VERSION,
            "x-acs-date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "x-acs-signature-nonce": secrets.token_hex(16),
            "x-acs-content-sha256": sha256_hex(body),
        }
        headers["Authorization"] = authorization(
            access_key_id=self._id, secret=self._secret, headers=headers, body=body
        )
        answer = await post_json(
            self._url.rstrip("/") + "/", body=body, headers=headers,
            within=self._timeout, what=f"aliyun {action}",
        )  # fmt: skip
        data = coded(answer, 200, f"aliyun {action}").get("Data")
        level, data = decided(data, "RiskLevel", RISK_LEVELS, f"aliyun {action}")
        results = data.get("Result")
        first = results[0] if isinstance(results, list) and results else None
        label = str(first.get("Label") or "") if isinstance(first, dict) else ""
        return Verdict(blocked=level == "high", label=f"aliyun:{label}")
