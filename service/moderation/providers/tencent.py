"""Tencent Cloud text (TMS) and image (IMS) moderation, signed with TC3-HMAC-SHA256.

Both are `POST /` with a JSON body to `tms.tencentcloudapi.com` or
`ims.tencentcloudapi.com` (or `moderation.endpoint` for both), action
`TextModeration` / `ImageModeration`, version 2020-12-29. The answer is
`{"Response": {"Suggestion": "Block"|"Review"|"Pass", "Label": ...}}`, or
`{"Response": {"Error": {"Code", "Message"}}}`. `Block` refuses; `Review` (a
human should look) lets the content through, as Tencent's own guidance leaves
that to the operator.
"""

from __future__ import annotations

import base64
import datetime as dt
import json
import time
from typing import Any, Final
from urllib.parse import urlsplit

from .base import Picture, ProviderError, Verdict
from .http import KeyedClient, decided, post_json
from .signing import canonical_request, derived_key, scoped_authorization

VERSION: Final = "2020-12-29"
REGION: Final = "ap-guangzhou"
SUGGESTIONS: Final = ("Block", "Review", "Pass")
ALGORITHM: Final = "TC3-HMAC-SHA256"
_CONTENT_TYPE: Final = "application/json; charset=utf-8"


def authorization(
    *,
    secret_id: str,
    secret_key: str,
    service: str,
    host: str,
    action: str,
    body: bytes,
    timestamp: int,
) -> str:
    """Sign one request (Tencent Cloud API 3.0, TC3-HMAC-SHA256)."""
    signed = {
        "content-type": _CONTENT_TYPE,
        "host": host,
        "x-tc-action": action.lower(),
    }
    canonical, names = canonical_request({}, signed, body)
    day = dt.datetime.fromtimestamp(timestamp, dt.UTC).strftime("%Y-%m-%d")
    scope = f"{day}/{service}/tc3_request"
    return scoped_authorization(
        ALGORITHM, key_id=secret_id, scope=scope, stamp=str(timestamp),
        canonical=canonical, names=names,
        key=derived_key(f"TC3{secret_key}".encode(), day, service, "tc3_request"),
    )  # fmt: skip


class Tencent(KeyedClient):
    """TMS for text, IMS for images."""

    name = "tencent"
    region = REGION

    async def text(self, content: str) -> Verdict:
        """TextModeration of a prompt (Content is the Base64 of its UTF-8)."""
        encoded = base64.b64encode(content.encode()).decode()
        return await self._call("tms", "TextModeration", {"Content": encoded})

    async def image(self, picture: Picture) -> Verdict:
        """ImageModeration of an image's bytes (FileContent, Base64, at most 10 MB)."""
        encoded = base64.b64encode(picture.data).decode()
        return await self._call("ims", "ImageModeration", {"FileContent": encoded})

    async def _call(self, service: str, action: str, params: dict[str, Any]) -> Verdict:
        url = self._endpoint or f"https://{service}.tencentcloudapi.com"
        host = urlsplit(url).netloc
        body = json.dumps(params).encode()
        timestamp = int(time.time())
        headers = {
            "Authorization": authorization(
                secret_id=self._id,
                secret_key=self._secret,
                service=service,
                host=host,
                action=action,
                body=body,
                timestamp=timestamp,
            ),
            "Content-Type": _CONTENT_TYPE,
            "Host": host,
            "X-TC-Action": action,
            "X-TC-Timestamp": str(timestamp),
            "X-TC-Version": VERSION,
            "X-TC-Region": self._region,
        }
        answer = await post_json(
            url.rstrip("/") + "/", body=body, headers=headers,
            within=self._timeout, what=f"tencent {action}",
        )  # fmt: skip
        response = answer.get("Response") if isinstance(answer, dict) else None
        if not isinstance(response, dict) or "Error" in response:
            code = (response or {}).get("Error", {}).get("Code", "malformed answer")
            raise ProviderError(f"tencent {action}: {code}")
        suggestion, _ = decided(
            response, "Suggestion", SUGGESTIONS, f"tencent {action}"
        )
        label = str(response.get("Label") or "")
        return Verdict(blocked=suggestion == "Block", label=f"tencent:{label}")
