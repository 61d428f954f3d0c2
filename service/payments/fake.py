"""The fake provider: plays Alipay and WeChat Pay over real HTTP, for dev and tests.

It keeps both providers' keys (shared by every process through Redis), answers
the adapters' query and refund calls as the real gateways do (checking our
request signatures, signing its answers), shows a pay/cancel page for each
order, and sends the providers' real notices, signed, to our webhooks.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlencode

import aiohttp
from aiohttp import web
from redis.asyncio import Redis

from ..studio.ledger import text
from . import signing
from .providers import alipay, wechatpay
from .providers.alipay import AlipayConfig
from .providers.wechatpay import SCHEME, WechatPayConfig

_LOGGER: Final = logging.getLogger(__name__)

PREFIX: Final = "/fake-pay"
KEYS_KEY: Final = "studio:fakepay:keys"
TRADE_TTL: Final = 7 * 86400
SEND_TIMEOUT: Final = aiohttp.ClientTimeout(total=10)
PROVIDER_NAMES: Final = {
    "alipay": ("支付宝", "Alipay"),
    "wechatpay": ("微信支付", "WeChat Pay"),
}

# created -> paid, once; the pay button and a second click agree on one trade_no.
_PAY: Final = """
if redis.call('HGET', KEYS[1], 'status') ~= 'created' then return 0 end
redis.call('HSET', KEYS[1], 'status', 'paid', 'trade_no', ARGV[1], 'paid_at', ARGV[2])
return 1
"""
# One refund per refund id: a known id refunds nothing more (as the real ones).
_REFUND: Final = """
local t = redis.call('HMGET', KEYS[1], 'status', 'total', 'refunded')
if not t[1] then return {'NOT_EXIST'} end
if t[1] ~= 'paid' then return {'NOT_PAID'} end
local refunded = tonumber(t[3] or '0')
local prior = redis.call('HGET', KEYS[1], 'r:' .. ARGV[1])
if prior then return {'KNOWN', prior, tostring(refunded)} end
local fen = tonumber(ARGV[2])
if fen <= 0 or refunded + fen > tonumber(t[2]) then return {'TOO_MUCH'} end
refunded = refunded + fen
redis.call('HSET', KEYS[1], 'r:' .. ARGV[1], ARGV[2], 'refunded', refunded)
redis.call('HINCRBY', KEYS[1], 'refunds', 1)
return {'DONE', ARGV[2], tostring(refunded)}
"""


def trade_key(order_id: str) -> str:
    """The Redis hash of one fake trade."""
    return f"studio:fakepay:trade:{order_id}"


def digits(count: int) -> str:
    """Random decimal digits (the providers' trade and refund numbers)."""
    return "".join(secrets.choice("0123456789") for _ in range(count))


@dataclass(frozen=True, slots=True)
class FakeKeys:
    """Both sides' keys and ids for the fake: ours and the fake providers'."""

    app_private_pem: str = field(repr=False)  # our Alipay app key (we sign)
    alipay_private_pem: str = field(repr=False)  # "Alipay"'s key (the fake signs)
    merchant_private_pem: str = field(repr=False)  # our WeChat Pay merchant key
    platform_private_pem: str = field(repr=False)  # "WeChat Pay"'s key
    apiv3_key: str = field(repr=False)
    alipay_app_id: str = "2021000000000001"
    seller_id: str = "2088000000000001"
    mchid: str = "1900000001"
    appid: str = "wx0000000000000001"
    serial: str = "5157F09EFDC096DE15EBE81A47057A7232F1B8E1"
    public_key_id: str = "PUB_KEY_ID_0119000000012025000000000001"

    @classmethod
    def generate(cls) -> FakeKeys:
        """Make four fresh RSA-2048 keys and an APIv3 key."""
        app, provider, merchant, platform = (
            signing.private_pem(signing.generate_private_key()) for _ in range(4)
        )
        return cls(app, provider, merchant, platform, secrets.token_hex(16))

    def to_json(self) -> str:
        """Everything, as JSON (for the shared Redis copy)."""
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> FakeKeys:
        """Read keys written by to_json."""
        return cls(**json.loads(text))

    @classmethod
    async def shared(cls, redis: Redis) -> FakeKeys:
        """The keys every process uses: the first one to start makes them."""
        await redis.set(KEYS_KEY, cls.generate().to_json(), nx=True)
        stored = await redis.get(KEYS_KEY)
        if stored is None:  # deleted in between: make them again
            return await cls.shared(redis)
        return cls.from_json(stored)

    def alipay_config(self, base_url: str) -> AlipayConfig:
        """The Alipay adapter's settings, pointed at the fake gateway."""
        return AlipayConfig(
            app_id=self.alipay_app_id,
            private_key_pem=self.app_private_pem,
            alipay_public_key_pem=signing.public_pem(
                signing.load_private_key(self.alipay_private_pem)
            ),
            gateway=f"{base_url.rstrip('/')}{PREFIX}/alipay/gateway.do",
            seller_id=self.seller_id,
        )

    def wechatpay_config(self, base_url: str) -> WechatPayConfig:
        """The WeChat Pay adapter's settings, pointed at the fake gateway."""
        return WechatPayConfig(
            mchid=self.mchid,
            appid=self.appid,
            serial=self.serial,
            private_key_pem=self.merchant_private_pem,
            apiv3_key=self.apiv3_key,
            public_key_pem=signing.public_pem(
                signing.load_private_key(self.platform_private_pem)
            ),
            public_key_id=self.public_key_id,
            base_url=f"{base_url.rstrip('/')}{PREFIX}/wechatpay",
        )


@dataclass(frozen=True, slots=True)
class Delivery:
    """One notice as sent to a webhook, and the status it got (0: unreachable)."""

    url: str
    headers: Mapping[str, str]
    body: bytes
    status: int = 0
    answer: bytes = b""


class FakeGateway:
    """The fake providers' state (in Redis) and their signing."""

    def __init__(
        self,
        keys: FakeKeys,
        redis: Redis,
        session: aiohttp.ClientSession,
        *,
        public_url: str = "",
    ) -> None:
        self.keys = keys
        self.redis = redis
        self.session = session
        # Where browsers reach the fake's pages; '' means the request's own origin.
        self.public_url = public_url.rstrip("/")
        # What WeChat Pay answers a new refund: SUCCESS, or PROCESSING (then
        # SUCCESS when asked again), as the real one may.
        self.refund_status = "SUCCESS"
        self._app_public = signing.load_private_key(keys.app_private_pem).public_key()
        self._alipay_key = signing.load_private_key(keys.alipay_private_pem)
        self._merchant_public = signing.load_private_key(
            keys.merchant_private_pem
        ).public_key()
        self._platform_key = signing.load_private_key(keys.platform_private_pem)
        self._aes = signing.aes_key(keys.apiv3_key)
        self._pay = redis.register_script(_PAY)
        self._refund = redis.register_script(_REFUND)

    # -- trades -------------------------------------------------------------

    async def record(
        self,
        order_id: str,
        provider: str,
        total_fen: int,
        subject: str,
        notify_url: str,
        return_url: str = "",
    ) -> None:
        """Open a trade (the first creation wins, as at the real providers)."""
        key = trade_key(order_id)
        first = {
            "provider": provider,
            "status": "created",
            "total": str(total_fen),
            "subject": subject,
            "notify_url": notify_url,
            "return_url": return_url,
            "refunded": "0",
            "refunds": "0",
        }
        async with self.redis.pipeline(transaction=True) as pipe:
            for name, value in first.items():
                pipe.hsetnx(key, name, value)
            pipe.expire(key, TRADE_TTL)
            await pipe.execute()

    async def trade(self, order_id: str) -> dict[str, str] | None:
        """A trade's fields, or None when the fake never saw the order."""
        raw = await self.redis.hgetall(trade_key(order_id))
        if not raw:
            return None
        return {text(k): text(v) for k, v in raw.items()}

    async def refunds(self, order_id: str) -> dict[str, int]:
        """The refunds made on a trade, by refund id."""
        trade = await self.trade(order_id) or {}
        return {k[2:]: int(v) for k, v in trade.items() if k.startswith("r:")}

    async def refund_trade(self, order_id: str, refund_id: str, fen: int) -> list[str]:
        """Refund once per refund id: [DONE|KNOWN, fen, cumulative] or [reason]."""
        reply = await self._refund(keys=[trade_key(order_id)], args=[refund_id, fen])
        return [text(part) for part in reply]

    # -- paying and console refunds -------------------------------------------

    async def pay(self, order_id: str) -> Delivery | None:
        """Mark a created trade paid and send its notice; None if not payable."""
        trade = await self.trade(order_id)
        if trade is None:
            return None
        provider = trade["provider"]
        trade_no = ("2025" if provider == "alipay" else "4200") + digits(24)
        now = time.time()
        if not await self._pay(keys=[trade_key(order_id)], args=[trade_no, repr(now)]):
            return None
        trade = await self.trade(order_id)
        assert trade is not None
        if provider == "alipay":
            return await self.deliver(self.alipay_notice(order_id, trade))
        return await self.deliver(self.wechat_paid_notice(order_id, trade))

    async def refund_from_console(self, order_id: str, cumulative_fen: int) -> Delivery:
        """Refund outside the service (a merchant console) and send its notice."""
        trade = await self.trade(order_id)
        if trade is None or trade["status"] != "paid":
            raise ValueError("no paid trade")
        fen = cumulative_fen - int(trade["refunded"])
        if fen <= 0:
            raise ValueError("nothing new to refund")
        refund_id = f"console-{order_id}-{int(trade['refunds']) + 1}"
        reply = await self.refund_trade(order_id, refund_id, fen)
        if reply[0] != "DONE":
            raise ValueError(f"refund refused: {reply[0]}")
        trade = await self.trade(order_id)
        assert trade is not None
        if trade["provider"] == "alipay":
            delivery = self.alipay_notice(order_id, trade, refund_id=refund_id)
        else:
            delivery = self.wechat_refund_notice(order_id, trade, refund_id, fen)
        return await self.deliver(delivery)

    async def deliver(self, delivery: Delivery) -> Delivery:
        """POST a notice to its webhook; the answer is in the returned copy."""
        try:
            async with self.session.post(
                delivery.url,
                data=delivery.body,
                headers=dict(delivery.headers),
                timeout=SEND_TIMEOUT,
            ) as response:
                answer = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as error:
            _LOGGER.warning("fake-pay notice not delivered: %s", type(error).__name__)
            return delivery
        return dataclasses.replace(delivery, status=status, answer=answer)

    # -- notices in the providers' formats ------------------------------------

    def alipay_notice(
        self, order_id: str, trade: Mapping[str, str], *, refund_id: str = ""
    ) -> Delivery:
        """Alipay's trade_status_sync form for a trade as it stands, signed."""
        now = datetime.datetime.now(datetime.UTC)
        total, refunded = int(trade["total"]), int(trade["refunded"])
        paid_at = datetime.datetime.fromtimestamp(float(trade["paid_at"]), datetime.UTC)
        amount = alipay.yuan(total)
        fields = {
            "gmt_create": alipay.beijing(paid_at),
            "charset": "utf-8",
            "gmt_payment": alipay.beijing(paid_at),
            "notify_time": alipay.beijing(now),
            "subject": trade["subject"],
            "buyer_id": "2088102177846880",
            "invoice_amount": amount,
            "version": "1.0",
            "notify_id": secrets.token_hex(16),
            "fund_bill_list": json.dumps(
                [{"amount": amount, "fundChannel": "ALIPAYACCOUNT"}]
            ),
            "notify_type": "trade_status_sync",
            "out_trade_no": order_id,
            "total_amount": amount,
            "trade_status": "TRADE_CLOSED" if refunded >= total else "TRADE_SUCCESS",
            "trade_no": trade["trade_no"],
            "auth_app_id": self.keys.alipay_app_id,
            "receipt_amount": amount,
            "point_amount": "0.00",
            "buyer_pay_amount": amount,
            "app_id": self.keys.alipay_app_id,
            "seller_id": self.keys.seller_id,
            "sign_type": "RSA2",
        }
        if refund_id:
            fields |= {
                "refund_fee": alipay.yuan(refunded),
                "gmt_refund": alipay.beijing(now) + ".000",
                "out_biz_no": refund_id,
            }
        fields["sign"] = signing.sign(
            self._alipay_key, alipay.notice_content(fields).encode()
        )
        return Delivery(
            url=trade["notify_url"],
            headers={
                "Content-Type": "application/x-www-form-urlencoded; charset=utf-8"
            },
            body=urlencode(fields).encode(),
        )

    def wechat_paid_notice(self, order_id: str, trade: Mapping[str, str]) -> Delivery:
        """A TRANSACTION.SUCCESS callback for a paid trade."""
        total = int(trade["total"])
        resource = {
            "mchid": self.keys.mchid,
            "appid": self.keys.appid,
            "out_trade_no": order_id,
            "transaction_id": trade["trade_no"],
            "trade_type": "NATIVE",
            "trade_state": "SUCCESS",
            "trade_state_desc": "支付成功",
            "bank_type": "OTHERS",
            "attach": "",
            "success_time": wechatpay.rfc3339(
                datetime.datetime.fromtimestamp(float(trade["paid_at"]), datetime.UTC)
            ),
            "payer": {"openid": "oUpF8uMuAJO_M2pxb1Q9zNjWeS6o"},
            "amount": {
                "total": total,
                "payer_total": total,
                "currency": "CNY",
                "payer_currency": "CNY",
            },
        }
        return self.wechat_notice(
            trade["notify_url"], "TRANSACTION.SUCCESS", "transaction", resource
        )

    def wechat_refund_notice(
        self, order_id: str, trade: Mapping[str, str], refund_id: str, fen: int
    ) -> Delivery:
        """A REFUND.SUCCESS callback: one refund (WeChat reports them one by one)."""
        total = int(trade["total"])
        resource = {
            "mchid": self.keys.mchid,
            "out_trade_no": order_id,
            "transaction_id": trade["trade_no"],
            "out_refund_no": refund_id,
            "refund_id": "50" + digits(27),
            "refund_status": "SUCCESS",
            "success_time": wechatpay.rfc3339(datetime.datetime.now(datetime.UTC)),
            "user_received_account": "支付用户零钱",
            "amount": {
                "total": total,
                "refund": fen,
                "payer_total": total,
                "payer_refund": fen,
            },
        }
        return self.wechat_notice(
            trade["notify_url"], "REFUND.SUCCESS", "refund", resource
        )

    def wechat_notice(
        self,
        url: str,
        event_type: str,
        original_type: str,
        resource: Mapping[str, Any],
        *,
        now: float | None = None,
    ) -> Delivery:
        """A WeChat Pay callback: the resource encrypted, the body signed."""
        once = secrets.token_hex(6)
        ciphertext = signing.aes_gcm_encrypt(
            self._aes,
            once,
            json.dumps(resource, ensure_ascii=False).encode(),
            original_type,
        )
        stamp = int(time.time() if now is None else now)
        event = {
            "id": f"EV-{secrets.token_hex(10)}",
            "create_time": wechatpay.rfc3339(
                datetime.datetime.fromtimestamp(stamp, datetime.UTC)
            ),
            "resource_type": "encrypt-resource",
            "event_type": event_type,
            "summary": "支付成功" if original_type == "transaction" else "退款成功",
            "resource": {
                "original_type": original_type,
                "algorithm": "AEAD_AES_256_GCM",
                "ciphertext": ciphertext,
                "associated_data": original_type,
                "nonce": once,
            },
        }
        body = json.dumps(event, ensure_ascii=False).encode()
        return Delivery(
            url=url,
            headers={
                "Content-Type": "application/json",
                **self.wechat_headers(body, stamp),
            },
            body=body,
        )

    def wechat_headers(self, body: bytes, stamp: int | None = None) -> dict[str, str]:
        """The Wechatpay-* headers that sign a body (a callback or an answer)."""
        stamp_text = str(int(time.time()) if stamp is None else stamp)
        once = wechatpay.nonce()
        signature = signing.sign(
            self._platform_key, wechatpay.message(stamp_text, once, body)
        )
        return {
            "Wechatpay-Timestamp": stamp_text,
            "Wechatpay-Nonce": once,
            "Wechatpay-Signature": signature,
            "Wechatpay-Serial": self.keys.public_key_id,
            "Wechatpay-Signature-Type": SCHEME,
        }

    # -- checking our requests and answering them ---------------------------

    def alipay_request_ok(self, params: Mapping[str, str]) -> bool:
        """Is this request signed with our app key, for our app, in RSA2?"""
        return (
            params.get("app_id") == self.keys.alipay_app_id
            and params.get("sign_type") == "RSA2"
            and signing.verify(
                self._app_public,
                alipay.request_content(params).encode(),
                params.get("sign", ""),
            )
        )

    def alipay_answer(self, method: str, payload: Mapping[str, Any]) -> web.Response:
        """A synchronous OpenAPI answer, signed over the response object's text."""
        content = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        sign = signing.sign(self._alipay_key, content.encode())
        key = method.replace(".", "_") + "_response"
        text = f'{{"{key}":{content},"sign":"{sign}"}}'
        return web.Response(text=text, content_type="application/json")

    def wechat_request_ok(self, request: web.Request, body: bytes) -> bool:
        """Is this request's Authorization ours, fresh and signed with our key?"""
        fields = wechatpay.authorization_fields(
            request.headers.get("Authorization", "")
        )
        stamp = fields.get("timestamp", "")
        seconds = wechatpay.epoch(stamp)
        if (
            fields.get("mchid") != self.keys.mchid
            or fields.get("serial_no") != self.keys.serial
            or seconds is None
            or abs(time.time() - seconds) >= wechatpay.WINDOW
        ):
            return False
        path = request.raw_path.removeprefix(f"{PREFIX}/wechatpay")
        signed = wechatpay.message(
            request.method, path, stamp, fields.get("nonce_str", ""), body
        )
        return signing.verify(
            self._merchant_public, signed, fields.get("signature", "")
        )

    def wechat_answer(self, status: int, payload: Mapping[str, Any]) -> web.Response:
        """A signed APIv3 answer."""
        body = json.dumps(payload, ensure_ascii=False).encode()
        return web.Response(
            status=status,
            body=body,
            content_type="application/json",
            headers=self.wechat_headers(body),
        )

    def page_url(self, request: web.Request, provider: str, order_id: str) -> str:
        """The absolute URL of an order's pay/cancel page."""
        origin = self.public_url or str(request.url.origin())
        return f"{origin}{PREFIX}/{provider}/checkout/{order_id}"


# The fake provider's gateway (only when payments.fake is on; its routes read it).
FAKE_GATEWAY: Final = web.AppKey("fake_gateway", FakeGateway)
