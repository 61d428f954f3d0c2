"""One interface for every payment provider, so orders never see a wire format."""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, Protocol

from aiohttp import web


@dataclass(frozen=True, slots=True)
class Checkout:
    """What a provider needs to start taking a payment for one order."""

    order_id: str
    fen: int  # amount in fen (yuan * 100)
    subject: str  # e.g. "流光工坊 980 积分"
    device: str  # "desktop" | "mobile"
    client_ip: str  # WeChat H5 scene_info.payer_client_ip
    notify_url: str  # <base_url>/webhooks/<provider>
    return_url: str  # <base_url>/studio?order=<id>#buy (the browser comes back)
    expires_at: datetime.datetime  # aware UTC


@dataclass(frozen=True, slots=True)
class Action:
    """Where the buyer's browser goes next: a redirect, or a QR code to show."""

    type: Literal["redirect", "qrcode"]
    url: str

    def as_json(self) -> dict[str, str]:
        """The `action` object of `POST /api/orders`."""
        if self.type == "qrcode":
            return {"type": "qrcode", "code_url": self.url}
        return {"type": "redirect", "url": self.url}


@dataclass(frozen=True, slots=True)
class Payment:
    """A provider's answer to a query about one order."""

    order_id: str
    # Alipay TRADE_SUCCESS / TRADE_FINISHED, WeChat trade_state SUCCESS / REFUND
    paid: bool
    trade_no: str  # the provider's transaction id ('' if none)
    total_fen: int
    refunded_fen: int  # cumulative; neither provider's query reports refunds: 0


# What a provider said of a refund it took: the money moved, or not yet.
RefundOutcome = Literal["done", "processing"]


@dataclass(frozen=True, slots=True)
class Notice:
    """A verified, parsed notice from a provider."""

    provider: str  # "alipay" | "wechatpay"
    event_id: str  # notify_id (Alipay) / "EV-..." id (WeChat)
    order_id: str  # out_trade_no
    # "other": e.g. a timeout TRADE_CLOSED, nothing to do; "refund_failed":
    # WeChat's REFUND.ABNORMAL or REFUND.CLOSED (the money did not move)
    kind: Literal["paid", "refund", "refund_failed", "other"]
    trade_no: str
    total_fen: int  # the order total the notice states (the caller checks it)
    # Alipay: the cumulative refunded money (refund_fee); WeChat: the amount of
    # the ONE refund named by refund_id (the caller adds refunds up).
    refunded_fen: int
    # WeChat refund notices only: the out_refund_no this notice is about; ''
    # for Alipay notices and for payments.
    refund_id: str = ""

    def __post_init__(self) -> None:
        """Refuse ids no store can keep: a lone surrogate (JSON's \\ud800) is one."""
        for text in (self.event_id, self.order_id, self.trade_no, self.refund_id):
            try:
                text.encode()
            except UnicodeEncodeError:
                raise BadNotice("BAD_REQUEST") from None


class BadNotice(Exception):
    """A notice not to act on: BAD_SIGNATURE | MISMATCH | STALE | BAD_REQUEST."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class ProviderError(Exception):
    """The provider is unreachable, answered garbage, or refused the request."""

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class Provider(Protocol):
    """A payment provider adapter (real, or played by the fake gateway)."""

    id: str  # "alipay" | "wechatpay"

    async def create(self, checkout: Checkout) -> Action:
        """Start a payment; the action leads the buyer's browser on."""
        ...

    async def query(self, order_id: str) -> Payment | None:
        """Ask the provider about an order; None when it has no such trade."""
        ...

    async def refund(
        self,
        order_id: str,
        refund_id: str,
        refund_fen: int,
        total_fen: int,
        notify_url: str,
    ) -> RefundOutcome:
        """Return money, idempotent by refund_id; ProviderError if refused.

        "done" once the provider says the money moved; "processing" while it
        has taken the refund but not yet moved it (a notice or a rerun tells).
        """
        ...

    def verify_notice(
        self, headers: Mapping[str, str], body: bytes, now: float
    ) -> Notice:
        """Check the signature first, then ids (MISMATCH) and time (STALE)."""
        ...

    def acknowledge(self) -> web.Response:
        """The answer that stops the provider resending a handled notice."""
        ...
