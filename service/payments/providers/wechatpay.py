"""WeChat Pay APIv3: native / H5 orders, query, refund and the callback."""

from __future__ import annotations

import datetime
import json
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import quote

import aiohttp
from aiohttp import web

from .. import signing
from .base import (
    Action,
    BadNotice,
    Checkout,
    Notice,
    Payment,
    ProviderError,
    RefundOutcome,
)

BASE_URL: Final = "https://api.mch.weixin.qq.com"
TIMEOUT: Final = aiohttp.ClientTimeout(total=10)
SCHEME: Final = "WECHATPAY2-SHA256-RSA2048"
# The official Java SDK refuses signed messages more than five minutes off.
WINDOW: Final = 300
BEIJING: Final = datetime.timezone(datetime.timedelta(hours=8))
# Seconds since the epoch in ASCII digits; 12 of them reach the year 33658.
_EPOCH: Final = re.compile(r"[0-9]{1,12}")
# The most fen one amount may state (10 billion yuan); more is not a payment.
MAX_FEN: Final = 10**12


@dataclass(frozen=True, slots=True)
class WechatPayConfig:
    """One merchant: its ids, our key, the APIv3 key, WeChat Pay's public key."""

    mchid: str
    appid: str
    serial: str  # the serial number of our merchant API certificate
    private_key_pem: str = field(repr=False)
    apiv3_key: str = field(repr=False)
    public_key_pem: str = field(repr=False)
    public_key_id: str  # "PUB_KEY_ID_..."
    base_url: str = BASE_URL


def nonce() -> str:
    """A 32-character random nonce, as the SDKs make them."""
    return secrets.token_hex(16).upper()


def rfc3339(moment: datetime.datetime) -> str:
    """A time as WeChat Pay writes it: "2025-01-02T15:04:05+08:00"."""
    return moment.astimezone(BEIJING).isoformat(timespec="seconds")


def message(*parts: str | bytes) -> bytes:
    """The signed text: every part followed by a newline.

    Header values arrive decoded with surrogateescape (aiohttp's way with bytes
    that are not UTF-8): encoding them the same way gives back the bytes sent.
    """
    return b"".join(
        (p if isinstance(p, bytes) else p.encode("utf-8", "surrogateescape")) + b"\n"
        for p in parts
    )


def epoch(text: str) -> int | None:
    """A Wechatpay-Timestamp as seconds; None unless it is 1-12 ASCII digits."""
    return int(text) if _EPOCH.fullmatch(text) else None


def amount_fen(value: object) -> int | None:
    """An amount of a notice in fen; None unless a whole number 0..MAX_FEN."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_FEN:
        return value
    return None


def authorization_fields(header: str) -> dict[str, str]:
    """The key="value" pairs of an Authorization header after its scheme."""
    scheme, _, rest = header.partition(" ")
    if scheme != SCHEME:
        return {}
    fields: dict[str, str] = {}
    for part in rest.split(","):
        key, sep, value = part.strip().partition("=")
        if not sep or len(value) < 2 or value[0] != '"' or value[-1] != '"':
            return {}
        fields[key] = value[1:-1]
    return fields


def lower_keys(headers: Mapping[str, str]) -> dict[str, str]:
    """Headers with lower-case names (a plain dict or aiohttp's CIMultiDict)."""
    return {key.lower(): value for key, value in headers.items()}


class WechatPayProvider:
    """WeChat Pay APIv3 in public-key mode: Native QR on desktops, H5 on phones."""

    id = "wechatpay"

    def __init__(self, config: WechatPayConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self._key = signing.load_private_key(config.private_key_pem)
        self._wechat_key = signing.load_public_key(config.public_key_pem)
        self._aes = signing.aes_key(config.apiv3_key)

    def authorization(self, method: str, path: str, body: str) -> str:
        """The Authorization header of one request (path with its query)."""
        stamp, once = str(int(time.time())), nonce()
        signature = signing.sign(self._key, message(method, path, stamp, once, body))
        return (
            f'{SCHEME} mchid="{self.config.mchid}",nonce_str="{once}",'
            f'signature="{signature}",timestamp="{stamp}",'
            f'serial_no="{self.config.serial}"'
        )

    def _signed_by_wechat(self, headers: dict[str, str], body: bytes) -> bool:
        """Check the Wechatpay-* signature of a response or a callback."""
        if headers.get("wechatpay-signature-type", SCHEME) != SCHEME:
            return False
        if headers.get("wechatpay-serial") != self.config.public_key_id:
            return False
        stamp = headers.get("wechatpay-timestamp", "")
        once = headers.get("wechatpay-nonce", "")
        signature = headers.get("wechatpay-signature", "")
        if not stamp or not once or not signature:
            return False
        return signing.verify(self._wechat_key, message(stamp, once, body), signature)

    async def call(
        self, method: str, path: str, payload: Mapping[str, Any] | None = None
    ) -> tuple[int, dict[str, Any]]:
        """Make one signed request; return the status and the (verified) JSON."""
        body = "" if payload is None else json.dumps(payload, ensure_ascii=False)
        headers = {
            "Authorization": self.authorization(method, path, body),
            "Accept": "application/json",
            "Content-Type": "application/json",
            "User-Agent": "studio-service",
            "Wechatpay-Serial": self.config.public_key_id,
        }
        url = self.config.base_url.rstrip("/") + path
        try:
            async with self.session.request(
                method,
                url,
                data=body.encode() or None,
                headers=headers,
                timeout=TIMEOUT,
            ) as response:
                raw = await response.read()
                status = response.status
                answer_headers = lower_keys(response.headers)
        except (aiohttp.ClientError, TimeoutError) as error:
            raise ProviderError("UNREACHABLE", type(error).__name__) from error
        if 200 <= status < 300:
            if not self._signed_by_wechat(answer_headers, raw):
                raise ProviderError("BAD_SIGNATURE", path.partition("?")[0])
            stamp = epoch(answer_headers["wechatpay-timestamp"])
            if stamp is None or abs(time.time() - stamp) >= WINDOW:
                raise ProviderError("STALE", "response timestamp")
        if not raw and status == 204:
            return status, {}
        try:
            answer = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ProviderError("BAD_RESPONSE", f"{status}, not JSON") from error
        if not isinstance(answer, dict):
            raise ProviderError("BAD_RESPONSE", f"{status}, not an object")
        return status, answer

    async def create(self, checkout: Checkout) -> Action:
        """A Native order (QR of code_url) on desktops, an H5 order on phones."""
        mobile = checkout.device == "mobile"
        payload: dict[str, Any] = {
            "appid": self.config.appid,
            "mchid": self.config.mchid,
            "description": checkout.subject[:127],
            "out_trade_no": checkout.order_id,
            "time_expire": rfc3339(checkout.expires_at),
            "notify_url": checkout.notify_url,
            "amount": {"total": checkout.fen, "currency": "CNY"},
        }
        if mobile:
            payload["scene_info"] = {
                "payer_client_ip": checkout.client_ip,
                "h5_info": {"type": "Wap"},
            }
        kind = "h5" if mobile else "native"
        status, answer = await self.call(
            "POST", f"/v3/pay/transactions/{kind}", payload
        )
        if status != 200:
            raise ProviderError(str(answer.get("code") or status), kind)
        if mobile:
            url = answer.get("h5_url")
            if not isinstance(url, str) or not url:
                raise ProviderError("BAD_RESPONSE", "no h5_url")
            # The H5 page sends the buyer back to redirect_url when they finish.
            back = quote(checkout.return_url, safe="")
            return Action("redirect", f"{url}&redirect_url={back}")
        code_url = answer.get("code_url")
        if not isinstance(code_url, str) or not code_url:
            raise ProviderError("BAD_RESPONSE", "no code_url")
        return Action("qrcode", code_url)

    async def query(self, order_id: str) -> Payment | None:
        """GET the transaction by out_trade_no; None while WeChat has no such order."""
        path = f"/v3/pay/transactions/out-trade-no/{order_id}?mchid={self.config.mchid}"
        status, answer = await self.call("GET", path)
        if status == 404 and answer.get("code") == "ORDER_NOT_EXIST":
            return None
        if status != 200:
            raise ProviderError(str(answer.get("code") or status), "query")
        if answer.get("out_trade_no") != order_id or answer.get("mchid") != (
            self.config.mchid
        ):
            raise ProviderError("BAD_RESPONSE", "another order")
        amount = answer.get("amount")
        total = amount.get("total", 0) if isinstance(amount, dict) else 0
        if not isinstance(total, int):
            raise ProviderError("BAD_RESPONSE", "amount.total")
        return Payment(
            order_id=order_id,
            paid=answer.get("trade_state") in ("SUCCESS", "REFUND"),
            trade_no=str(answer.get("transaction_id", "")),
            total_fen=total,
            refunded_fen=0,
        )

    async def refund(
        self,
        order_id: str,
        refund_id: str,
        refund_fen: int,
        total_fen: int,
        notify_url: str,
    ) -> RefundOutcome:
        """POST a refund with out_refund_no = refund_id (a retry is the same refund).

        SUCCESS: the money moved. PROCESSING: taken, not yet moved; its
        REFUND.SUCCESS (or ABNORMAL, CLOSED) notice comes to notify_url.
        """
        payload = {
            "out_trade_no": order_id,
            "out_refund_no": refund_id,
            "notify_url": notify_url,
            "amount": {"refund": refund_fen, "total": total_fen, "currency": "CNY"},
        }
        status, answer = await self.call("POST", "/v3/refund/domestic/refunds", payload)
        if status != 200:
            raise ProviderError(str(answer.get("code") or status), "refund")
        if answer.get("out_refund_no") != refund_id:
            raise ProviderError("BAD_RESPONSE", "another refund")
        state = answer.get("status")
        if state == "SUCCESS":
            return "done"
        if state == "PROCESSING":
            return "processing"
        raise ProviderError(str(state or "BAD_RESPONSE"), "refund")

    def verify_notice(
        self, headers: Mapping[str, str], body: bytes, now: float
    ) -> Notice:
        """Check the callback's signature and time, decrypt it, check the ids."""
        lowered = lower_keys(headers)
        if not self._signed_by_wechat(lowered, body):
            raise BadNotice("BAD_SIGNATURE")
        stamp = epoch(lowered["wechatpay-timestamp"])
        if stamp is None:
            raise BadNotice("BAD_REQUEST")
        if abs(now - stamp) >= WINDOW:
            raise BadNotice("STALE")
        event = _object(body)
        resource = event.get("resource")
        if (
            event.get("resource_type") != "encrypt-resource"
            or not isinstance(resource, dict)
            or resource.get("algorithm") != "AEAD_AES_256_GCM"
        ):
            raise BadNotice("BAD_REQUEST")
        try:
            plain = signing.aes_gcm_decrypt(
                self._aes,
                str(resource.get("nonce", "")),
                str(resource.get("ciphertext", "")),
                str(resource.get("associated_data") or ""),
            )
        except signing.Undecryptable as error:
            raise BadNotice("BAD_SIGNATURE") from error
        data = _object(plain)
        if data.get("mchid") != self.config.mchid:
            raise BadNotice("MISMATCH")
        # A refund resource carries no appid; a transaction's must be ours.
        transaction = resource.get("original_type") == "transaction"
        if (transaction or "appid" in data) and data.get("appid") != self.config.appid:
            raise BadNotice("MISMATCH")
        return self._notice(event, data)

    def _notice(self, event: dict[str, Any], data: dict[str, Any]) -> Notice:
        """Read a decrypted transaction or refund into a Notice."""
        event_id, order_id = event.get("id"), data.get("out_trade_no")
        amount = data.get("amount")
        if (
            not isinstance(event_id, str)
            or not event_id
            or not isinstance(order_id, str)
            or not order_id
            or not isinstance(amount, dict)
        ):
            raise BadNotice("BAD_REQUEST")
        total = amount_fen(amount.get("total", 0))
        refunded = amount_fen(amount.get("refund", 0))
        if total is None or refunded is None:
            raise BadNotice("BAD_REQUEST")
        kind: Literal["paid", "refund", "refund_failed", "other"] = "other"
        refund_id = ""
        event_type = event.get("event_type")
        if event_type == "TRANSACTION.SUCCESS" and data.get("trade_state") == "SUCCESS":
            kind, refunded = "paid", 0
        elif event_type == "REFUND.SUCCESS" and data.get("refund_status") == "SUCCESS":
            kind, refund_id = "refund", str(data.get("out_refund_no", ""))
            if not refund_id or refunded <= 0:
                raise BadNotice("BAD_REQUEST")
        elif event_type in ("REFUND.ABNORMAL", "REFUND.CLOSED"):
            kind, refund_id = "refund_failed", str(data.get("out_refund_no", ""))
            refunded = 0
        else:
            refunded = 0
        return Notice(
            provider=self.id,
            event_id=event_id,
            order_id=order_id,
            kind=kind,
            trade_no=str(data.get("transaction_id", "")),
            total_fen=total,
            refunded_fen=refunded,
            refund_id=refund_id,
        )

    def acknowledge(self) -> web.Response:
        """WeChat Pay takes 200 or 204 with no body as handled."""
        return web.Response(status=204)


def _object(raw: bytes) -> dict[str, Any]:
    """A JSON object from bytes; BAD_REQUEST otherwise."""
    try:
        value = json.loads(raw)
    except ValueError as error:  # not JSON or UTF-8, or a number of 4,300+ digits
        raise BadNotice("BAD_REQUEST") from error
    if not isinstance(value, dict):
        raise BadNotice("BAD_REQUEST")
    return value
