"""Alipay (RSA2 OpenAPI): page / wap pay, query, refund and the notify form."""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal
from urllib.parse import parse_qsl, urlencode

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

GATEWAY: Final = "https://openapi.alipay.com/gateway.do"
TIMEOUT: Final = aiohttp.ClientTimeout(total=10)
# Alipay reads and writes its times on Beijing time, without an offset.
BEIJING: Final = datetime.timezone(datetime.timedelta(hours=8))
TIME_FORMAT: Final = "%Y-%m-%d %H:%M:%S"
# ASCII digits only: \d and int() would also read "9٨" as 98.
_AMOUNT: Final = re.compile(r"(0|[1-9][0-9]{0,9})(\.[0-9]{1,2})?")


@dataclass(frozen=True, slots=True)
class AlipayConfig:
    """One Alipay app: its id, our key, Alipay's key, where to call."""

    app_id: str
    private_key_pem: str = field(repr=False)
    alipay_public_key_pem: str = field(repr=False)
    gateway: str = GATEWAY
    seller_id: str = ""  # the merchant's PID; notices must name it when set


def yuan(fen: int) -> str:
    """An amount as Alipay writes it: 9800 -> "98.00"."""
    return f"{fen // 100}.{fen % 100:02d}"


def fen_of(text: str) -> int:
    """Read Alipay's "98.00" as 9800 fen; ValueError when it is not an amount."""
    match = _AMOUNT.fullmatch(text)
    if match is None:
        raise ValueError("not an amount")
    cents = (match.group(2) or ".")[1:].ljust(2, "0")
    return int(match.group(1)) * 100 + int(cents)


def beijing(moment: datetime.datetime) -> str:
    """An aware time as Alipay writes it ("2025-01-02 15:04:05", UTC+8)."""
    return moment.astimezone(BEIJING).strftime(TIME_FORMAT)


def request_content(params: Mapping[str, str]) -> str:
    """The string a request's sign covers: every non-empty parameter but sign."""
    return "&".join(
        f"{key}={value}"
        for key, value in sorted(params.items())
        if key != "sign" and value != ""
    )


def notice_content(params: Mapping[str, str]) -> str:
    """The string a notice's sign covers: also without sign_type."""
    return request_content({k: v for k, v in params.items() if k != "sign_type"})


def response_content(raw: str, response_key: str) -> str | None:
    """The raw text of `response_key`'s object, byte-exact, as its sign covers."""
    at = raw.find(f'"{response_key}"')
    if at < 0:
        return None
    colon = raw.find(":", at + len(response_key) + 2)
    if colon < 0:
        return None
    start = colon + 1
    while start < len(raw) and raw[start] in " \t\r\n":
        start += 1
    try:
        _, end = json.JSONDecoder().raw_decode(raw, start)
    except json.JSONDecodeError:
        return None
    return raw[start:end]


def parse_form(body: bytes) -> dict[str, str]:
    """A notify body's fields; BAD_REQUEST when it is not a plain UTF-8 form."""
    try:
        pairs = parse_qsl(body.decode(), keep_blank_values=True, errors="strict")
    except (UnicodeDecodeError, ValueError) as error:
        raise BadNotice("BAD_REQUEST") from error
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise BadNotice("BAD_REQUEST")
    return fields


class AlipayProvider:
    """Alipay's computer-website and mobile-website payments, RSA2-signed."""

    id = "alipay"

    def __init__(self, config: AlipayConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self._key = signing.load_private_key(config.private_key_pem)
        self._alipay_key = signing.load_public_key(config.alipay_public_key_pem)

    def signed(
        self, method: str, biz: Mapping[str, Any], **extra: str
    ) -> dict[str, str]:
        """The full, signed parameters of one OpenAPI call."""
        params = {
            "app_id": self.config.app_id,
            "method": method,
            "charset": "utf-8",
            "sign_type": "RSA2",
            "timestamp": beijing(datetime.datetime.now(datetime.UTC)),
            "version": "1.0",
            "biz_content": json.dumps(biz, ensure_ascii=False, separators=(",", ":")),
            **extra,
        }
        params["sign"] = signing.sign(self._key, request_content(params).encode())
        return params

    async def create(self, checkout: Checkout) -> Action:
        """Send the browser to the gateway with a signed page-pay (or wap-pay) query."""
        mobile = checkout.device == "mobile"
        biz = {
            "out_trade_no": checkout.order_id,
            "total_amount": yuan(checkout.fen),
            "subject": checkout.subject,
            "product_code": "QUICK_WAP_PAY" if mobile else "FAST_INSTANT_TRADE_PAY",
            "time_expire": beijing(checkout.expires_at),
        }
        if mobile:
            biz["quit_url"] = checkout.return_url
        params = self.signed(
            "alipay.trade.wap.pay" if mobile else "alipay.trade.page.pay",
            biz,
            notify_url=checkout.notify_url,
            return_url=checkout.return_url,
        )
        return Action("redirect", f"{self.config.gateway}?{urlencode(params)}")

    async def call(self, method: str, biz: Mapping[str, Any]) -> dict[str, Any]:
        """Make one server-side call and return its verified response object."""
        params = self.signed(method, biz)
        try:
            async with self.session.post(
                self.config.gateway, data=params, timeout=TIMEOUT
            ) as response:
                raw = (await response.read()).decode()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, UnicodeDecodeError) as error:
            raise ProviderError("UNREACHABLE", type(error).__name__) from error
        if status != 200:
            raise ProviderError("BAD_STATUS", str(status))
        key = method.replace(".", "_") + "_response"
        try:
            outer = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ProviderError("BAD_RESPONSE", "not JSON") from error
        if not isinstance(outer, dict):
            raise ProviderError("BAD_RESPONSE", "not an object")
        if not isinstance(outer.get("sign"), str):
            answer = outer.get(key) or outer.get("error_response")
            code = answer.get("sub_code", "") if isinstance(answer, dict) else ""
            raise ProviderError("UNSIGNED", str(code))
        content = response_content(raw, key)
        if content is None or not signing.verify(
            self._alipay_key, content.encode(), outer["sign"]
        ):
            raise ProviderError("BAD_SIGNATURE", method)
        answer = json.loads(content)
        if not isinstance(answer, dict):
            raise ProviderError("BAD_RESPONSE", "not an object")
        return answer

    async def query(self, order_id: str) -> Payment | None:
        """alipay.trade.query; None while Alipay has no such trade."""
        answer = await self.call("alipay.trade.query", {"out_trade_no": order_id})
        if answer.get("code") != "10000":
            if answer.get("sub_code") == "ACQ.TRADE_NOT_EXIST":
                return None
            raise ProviderError(str(answer.get("sub_code") or answer.get("code")))
        if answer.get("out_trade_no") != order_id:
            raise ProviderError("BAD_RESPONSE", "another trade")
        try:
            total = fen_of(str(answer.get("total_amount", "")))
        except ValueError as error:
            raise ProviderError("BAD_RESPONSE", "total_amount") from error
        return Payment(
            order_id=order_id,
            paid=answer.get("trade_status") in ("TRADE_SUCCESS", "TRADE_FINISHED"),
            trade_no=str(answer.get("trade_no", "")),
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
        """alipay.trade.refund with out_request_no = refund_id (a retry is a no-op).

        fund_change Y: the money moved. N (a retry, or money not moved yet):
        alipay.trade.fastpay.refund.query says whether the refund succeeded.
        Alipay's notices go to the trade's notify_url, so `notify_url` is unused.
        """
        biz = {
            "out_trade_no": order_id,
            "refund_amount": yuan(refund_fen),
            "out_request_no": refund_id,
        }
        answer = await self.call("alipay.trade.refund", biz)
        if answer.get("code") != "10000":
            raise ProviderError(str(answer.get("sub_code") or answer.get("code")))
        if answer.get("fund_change") == "Y":
            return "done"
        query = {"out_trade_no": order_id, "out_request_no": refund_id}
        found = await self.call("alipay.trade.fastpay.refund.query", query)
        if found.get("code") != "10000":
            raise ProviderError(str(found.get("sub_code") or found.get("code")))
        return (
            "done" if found.get("refund_status") == "REFUND_SUCCESS" else "processing"
        )

    def verify_notice(
        self, headers: Mapping[str, str], body: bytes, now: float
    ) -> Notice:
        """Check an asynchronous notify form's RSA2 sign, then its ids."""
        fields = parse_form(body)
        sign = fields.get("sign", "")
        if not sign or fields.get("sign_type", "RSA2") != "RSA2":
            raise BadNotice("BAD_SIGNATURE")
        if not signing.verify(self._alipay_key, notice_content(fields).encode(), sign):
            raise BadNotice("BAD_SIGNATURE")
        if fields.get("app_id") != self.config.app_id:
            raise BadNotice("MISMATCH")
        if self.config.seller_id and fields.get("seller_id") != self.config.seller_id:
            raise BadNotice("MISMATCH")
        order_id, event_id = fields.get("out_trade_no", ""), fields.get("notify_id", "")
        if not order_id or not event_id:
            raise BadNotice("BAD_REQUEST")
        try:
            total = fen_of(fields.get("total_amount", ""))
            refunded = fen_of(fields.get("refund_fee") or "0")
        except ValueError as error:
            raise BadNotice("BAD_REQUEST") from error
        status = fields.get("trade_status", "")
        kind: Literal["paid", "refund", "other"] = "other"
        if refunded > 0 and status in (
            "TRADE_SUCCESS",
            "TRADE_FINISHED",
            "TRADE_CLOSED",
        ):
            kind = "refund"
        elif status in ("TRADE_SUCCESS", "TRADE_FINISHED"):
            kind = "paid"
        return Notice(
            provider=self.id,
            event_id=event_id,
            order_id=order_id,
            kind=kind,
            trade_no=fields.get("trade_no", ""),
            total_fen=total,
            refunded_fen=refunded,
        )

    def acknowledge(self) -> web.Response:
        """Alipay stops resending on exactly the bytes `success`."""
        return web.Response(text="success", content_type="text/plain")
