"""Volcengine content security (业务安全 BusinessSecurity), signed HMAC-SHA256 (V4).

Both calls are `POST /?Action=...&Version=...` to `riskcontrol.volcengineapi.com`
(the host Volcengine's own SDK uses; or `moderation.endpoint`), service
`BusinessSecurity`, region `cn-north-1`, with a JSON body `{"AppId": <int>,
"Service": ..., "Parameters": "<a JSON text>"}`. Text goes to `TextSliceRisk`
(2022-11-07, service `text_risk`); an image to `ImageContentRiskV2`
(2021-11-29, service `image_content_risk`) by its URL, which Volcengine
fetches. The answer is `{"ResponseMetadata": {...}, "Result": {"Code": 0,
"Data": {"Decision": "PASS"|"REVIEW"|"BLOCK", "FinalLabel": ...}}}`, or
`ResponseMetadata.Error {Code, Message}`, or a non-zero `Result.Code`.
`BLOCK` refuses; `PASS` and `REVIEW` let the content through; any other
Decision is an error (so nothing passes unread).
"""

from __future__ import annotations

import datetime as dt
import json
import secrets
import time
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from .base import Picture, ProviderError, Verdict
from .http import KeyedClient, coded, decided, post_json
from .signing import (
    canonical_request,
    derived_key,
    scoped_authorization,
    sha256_hex,
)

SERVICE: Final = "BusinessSecurity"
REGION: Final = "cn-north-1"
HOST: Final = "riskcontrol.volcengineapi.com"
ALGORITHM: Final = "HMAC-SHA256"
# The action, its version and the Service named in the body.
TEXT: Final = ("TextSliceRisk", "2022-11-07", "text_risk")
IMAGE: Final = ("ImageContentRiskV2", "2021-11-29", "image_content_risk")
DECISIONS: Final = ("PASS", "REVIEW", "BLOCK")


def authorization(
    *,
    key_id: str,
    secret: str,
    region: str,
    query: Mapping[str, str],
    headers: Mapping[str, str],
    body: bytes,
) -> str:
    """Sign a POST / (Volcengine's V4): the query and every given header."""
    canonical, names = canonical_request(query, headers, body)
    stamp = headers["X-Date"]
    scope = f"{stamp[:8]}/{region}/{SERVICE}/request"
    return scoped_authorization(
        ALGORITHM, key_id=key_id, scope=scope, stamp=stamp, canonical=canonical,
        names=names,
        key=derived_key(secret.encode(), stamp[:8], region, SERVICE, "request"),
    )  # fmt: skip


class Volcengine(KeyedClient):
    """TextSliceRisk for text, ImageContentRiskV2 (by URL) for images."""

    name = "volcengine"
    region = REGION

    async def text(self, content: str) -> Verdict:
        """TextSliceRisk of a prompt."""
        return await self._call(TEXT, {"text": content})

    async def image(self, picture: Picture) -> Verdict:
        """ImageContentRiskV2 of the image at its URL."""
        if not picture.url:
            raise ProviderError("volcengine ImageContentRiskV2: no URL for the image")
        return await self._call(IMAGE, {"url": picture.url})

    async def _call(
        self, api: tuple[str, str, str], fields: Mapping[str, str]
    ) -> Verdict:
        action, version, service = api
        parameters = {
            **fields,
            "biztype": self._settings.biz_type,
            "account_id": "studio",
            "data_id": secrets.token_hex(8),
            "operate_time": int(time.time()),
        }
        body = json.dumps(
            {
                "AppId": int(self._settings.app_id),
                "Service": service,
                "Parameters": json.dumps(parameters, ensure_ascii=False),
            }
        ).encode()
        url = self._endpoint or f"https://{HOST}"
        query = {"Action": action, "Version": version}
        headers = {
            "Host": urlsplit(url).netloc,
            "Content-Type": "application/json",
            "X-Date": dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ"),
            "X-Content-Sha256": sha256_hex(body),
        }
        headers["Authorization"] = authorization(
            key_id=self._id, secret=self._secret, region=self._region,
            query=query, headers=headers, body=body,
        )  # fmt: skip
        answer = await post_json(
            f"{url.rstrip('/')}/?Action={action}&Version={version}",
            body=body, headers=headers, within=self._timeout,
            what=f"volcengine {action}",
        )  # fmt: skip
        return _verdict(action, answer)


def _verdict(action: str, answer: Any) -> Verdict:
    """Read a Decision out of an answer, or raise ProviderError with its code."""
    if not isinstance(answer, dict):
        raise ProviderError(f"volcengine {action}: malformed answer")
    error = (answer.get("ResponseMetadata") or {}).get("Error")
    if error:
        raise ProviderError(f"volcengine {action}: {error.get('Code', 'error')}")
    data = coded(answer.get("Result"), 0, f"volcengine {action}").get("Data")
    decision, data = decided(data, "Decision", DECISIONS, f"volcengine {action}")
    label = str(data.get("FinalLabel") or "")
    return Verdict(blocked=decision == "BLOCK", label=f"volcengine:{label}")
