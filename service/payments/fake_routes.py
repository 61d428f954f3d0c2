"""The fake providers' HTTP side: both gateways and the buyer's pay/cancel page."""

from __future__ import annotations

import datetime
import html
import json
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final
from urllib.parse import urlsplit

from aiohttp import web

from ..web.hardening import MALFORMED_FORM
from .fake import FAKE_GATEWAY, PREFIX, PROVIDER_NAMES, FakeGateway, digits
from .providers import alipay, wechatpay

_LOGGER: Final = logging.getLogger(__name__)


async def _form(request: web.Request) -> dict[str, str]:
    """The fields of a POSTed form (files left out); 400 if it cannot be read."""
    try:
        form = await request.post()
    except MALFORMED_FORM:
        raise web.HTTPBadRequest(text="a form that cannot be read") from None
    return {k: v for k, v in form.items() if isinstance(v, str)}


# -- the fake Alipay gateway ---------------------------------------------------


async def alipay_gateway(request: web.Request) -> web.StreamResponse:
    """GET|POST gateway.do: page/wap pay (the browser), query and refund."""
    fake = request.app[FAKE_GATEWAY]
    params = dict(request.query)
    if request.method == "POST":
        params |= await _form(request)
    method = params.get("method", "")
    browser = method in ("alipay.trade.page.pay", "alipay.trade.wap.pay")
    if not fake.alipay_request_ok(params):
        if browser:
            return _page("验签出错 · Invalid signature", [], status=400)
        error = {
            "code": "40002",
            "msg": "Invalid Arguments",
            "sub_code": "isv.invalid-signature",
        }
        return web.json_response({method.replace(".", "_") + "_response": error})
    try:
        biz = json.loads(params.get("biz_content", ""))
        order_id = str(biz["out_trade_no"])
        total = alipay.fen_of(str(biz.get("total_amount", "0")))
    except (ValueError, KeyError, TypeError):
        if browser:
            return _page("参数错误 · Invalid parameters", [], status=400)
        return fake.alipay_answer(method, _alipay_failure("ACQ.INVALID_PARAMETER"))
    if browser:
        await fake.record(
            order_id,
            "alipay",
            total,
            str(biz.get("subject", "")),
            params.get("notify_url", ""),
            params.get("return_url", ""),
        )
        raise web.HTTPSeeOther(f"{PREFIX}/alipay/checkout/{order_id}")
    if method == "alipay.trade.query":
        return fake.alipay_answer(method, await _alipay_query(fake, order_id))
    if method == "alipay.trade.refund":
        return fake.alipay_answer(method, await _alipay_refund(fake, order_id, biz))
    if method == "alipay.trade.fastpay.refund.query":
        return fake.alipay_answer(method, await _alipay_refund_query(fake, biz))
    return web.json_response(
        {
            "error_response": {
                "code": "40004",
                "msg": "Business Failed",
                "sub_code": "isv.invalid-method",
            }
        }
    )


def _alipay_failure(sub_code: str) -> dict[str, str]:
    return {
        "code": "40004",
        "msg": "Business Failed",
        "sub_code": sub_code,
        "sub_msg": sub_code,
    }


async def _alipay_query(fake: FakeGateway, order_id: str) -> dict[str, str]:
    trade = await fake.trade(order_id)
    if trade is None or trade["provider"] != "alipay":
        return _alipay_failure("ACQ.TRADE_NOT_EXIST")
    total, refunded = int(trade["total"]), int(trade["refunded"])
    status = "WAIT_BUYER_PAY"
    if trade["status"] == "paid":
        status = "TRADE_CLOSED" if refunded >= total else "TRADE_SUCCESS"
    answer = {
        "code": "10000",
        "msg": "Success",
        "out_trade_no": order_id,
        "trade_status": status,
        "total_amount": alipay.yuan(total),
    }
    if trade["status"] == "paid":
        answer |= {
            "trade_no": trade["trade_no"],
            "buyer_logon_id": "buy***@example.com",
            "buyer_pay_amount": alipay.yuan(total),
            "send_pay_date": alipay.beijing(
                datetime.datetime.fromtimestamp(float(trade["paid_at"]), datetime.UTC)
            ),
        }
    return answer


async def _alipay_refund_query(
    fake: FakeGateway, biz: Mapping[str, Any]
) -> dict[str, str]:
    """alipay.trade.fastpay.refund.query: REFUND_SUCCESS once a refund moved."""
    order_id, refund_id = str(biz["out_trade_no"]), str(biz.get("out_request_no", ""))
    trade = await fake.trade(order_id)
    if trade is None or trade["provider"] != "alipay":
        return _alipay_failure("ACQ.TRADE_NOT_EXIST")
    answer = {
        "code": "10000",
        "msg": "Success",
        "out_trade_no": order_id,
        "out_request_no": refund_id,
        "total_amount": alipay.yuan(int(trade["total"])),
    }
    if (fen := (await fake.refunds(order_id)).get(refund_id)) is not None:
        answer |= {"refund_amount": alipay.yuan(fen), "refund_status": "REFUND_SUCCESS"}
    return answer


async def _alipay_refund(
    fake: FakeGateway, order_id: str, biz: Mapping[str, Any]
) -> dict[str, str]:
    try:
        fen = alipay.fen_of(str(biz.get("refund_amount", "")))
    except ValueError:
        return _alipay_failure("ACQ.INVALID_PARAMETER")
    refund_id = str(biz.get("out_request_no") or order_id)
    trade = await fake.trade(order_id)
    if trade is None or trade["provider"] != "alipay":
        return _alipay_failure("ACQ.TRADE_NOT_EXIST")
    reply = await fake.refund_trade(order_id, refund_id, fen)
    failures = {
        "NOT_PAID": "ACQ.TRADE_STATUS_ERROR",
        "TOO_MUCH": "ACQ.REFUND_AMT_NOT_EQUAL_TOTAL",
    }
    if reply[0] in failures or reply[0] == "NOT_EXIST":
        return _alipay_failure(failures.get(reply[0], "ACQ.TRADE_NOT_EXIST"))
    return {
        "code": "10000",
        "msg": "Success",
        "trade_no": trade["trade_no"],
        "out_trade_no": order_id,
        "buyer_logon_id": "buy***@example.com",
        "fund_change": "Y" if reply[0] == "DONE" else "N",
        "refund_fee": alipay.yuan(int(reply[2])),
        "gmt_refund_pay": alipay.beijing(datetime.datetime.now(datetime.UTC)),
    }


# -- the fake WeChat Pay APIv3 ---------------------------------------------------


async def _wechat_body(
    request: web.Request,
) -> tuple[FakeGateway, bytes] | web.Response:
    fake = request.app[FAKE_GATEWAY]
    body = await request.read()
    if not fake.wechat_request_ok(request, body):
        return web.json_response(
            {"code": "SIGN_ERROR", "message": "签名错误"}, status=401
        )
    return fake, body


async def wechat_create(request: web.Request) -> web.Response:
    """POST /v3/pay/transactions/native|h5: record the trade, answer its URL."""
    checked = await _wechat_body(request)
    if isinstance(checked, web.Response):
        return checked
    fake, body = checked
    kind = request.match_info["kind"]
    try:
        order = json.loads(body)
        order_id, total = str(order["out_trade_no"]), int(order["amount"]["total"])
        ours = order["mchid"] == fake.keys.mchid and order["appid"] == fake.keys.appid
        notify_url, subject = str(order["notify_url"]), str(order["description"])
        complete = kind == "native" or "scene_info" in order
    except (ValueError, KeyError, TypeError):
        ours = complete = False
    if not ours or not complete:
        return fake.wechat_answer(400, {"code": "PARAM_ERROR", "message": "参数错误"})
    await fake.record(order_id, "wechatpay", total, subject, notify_url)
    page = fake.page_url(request, "wechatpay", order_id)
    if kind == "h5":
        return fake.wechat_answer(
            200, {"h5_url": f"{page}?prepay_id=wx{secrets.token_hex(14)}"}
        )
    return fake.wechat_answer(200, {"code_url": page})


async def wechat_query(request: web.Request) -> web.Response:
    """GET /v3/pay/transactions/out-trade-no/{id}?mchid=."""
    checked = await _wechat_body(request)
    if isinstance(checked, web.Response):
        return checked
    fake, _ = checked
    order_id = request.match_info["order_id"]
    trade = await fake.trade(order_id)
    if request.query.get("mchid") != fake.keys.mchid:
        return fake.wechat_answer(400, {"code": "PARAM_ERROR", "message": "mchid"})
    if trade is None or trade["provider"] != "wechatpay":
        return fake.wechat_answer(
            404, {"code": "ORDER_NOT_EXIST", "message": "订单不存在"}
        )
    total, paid = int(trade["total"]), trade["status"] == "paid"
    state = "NOTPAY"
    if paid:
        state = "REFUND" if int(trade["refunded"]) > 0 else "SUCCESS"
    answer: dict[str, Any] = {
        "appid": fake.keys.appid,
        "mchid": fake.keys.mchid,
        "out_trade_no": order_id,
        "trade_state": state,
        "trade_state_desc": state,
        "amount": {"total": total, "currency": "CNY"},
    }
    if paid:
        answer |= {
            "transaction_id": trade["trade_no"],
            "trade_type": "NATIVE",
            "success_time": wechatpay.rfc3339(
                datetime.datetime.fromtimestamp(float(trade["paid_at"]), datetime.UTC)
            ),
        }
    return fake.wechat_answer(200, answer)


async def wechat_refund(request: web.Request) -> web.Response:
    """POST /v3/refund/domestic/refunds: one refund per out_refund_no."""
    checked = await _wechat_body(request)
    if isinstance(checked, web.Response):
        return checked
    fake, body = checked
    try:
        ask = json.loads(body)
        order_id, refund_id = str(ask["out_trade_no"]), str(ask["out_refund_no"])
        fen, total = int(ask["amount"]["refund"]), int(ask["amount"]["total"])
    except (ValueError, KeyError, TypeError):
        return fake.wechat_answer(400, {"code": "PARAM_ERROR", "message": "参数错误"})
    trade = await fake.trade(order_id)
    if trade is None or trade["provider"] != "wechatpay":
        return fake.wechat_answer(
            404, {"code": "RESOURCE_NOT_EXISTS", "message": "订单不存在"}
        )
    if total != int(trade["total"]):
        return fake.wechat_answer(
            400, {"code": "PARAM_ERROR", "message": "订单金额不一致"}
        )
    reply = await fake.refund_trade(order_id, refund_id, fen)
    if reply[0] == "NOT_PAID":
        return fake.wechat_answer(
            400, {"code": "INVALID_REQUEST", "message": "订单未支付"}
        )
    if reply[0] != "DONE" and reply[0] != "KNOWN":
        return fake.wechat_answer(
            403, {"code": "NOT_ENOUGH", "message": "可退金额不足"}
        )
    refunded = int(reply[1])
    return fake.wechat_answer(
        200,
        {
            "refund_id": "50" + digits(27),
            "out_refund_no": refund_id,
            "transaction_id": trade["trade_no"],
            "out_trade_no": order_id,
            "channel": "ORIGINAL",
            "user_received_account": "支付用户零钱",
            "create_time": wechatpay.rfc3339(datetime.datetime.now(datetime.UTC)),
            "status": fake.refund_status if reply[0] == "DONE" else "SUCCESS",
            "amount": {
                "total": total,
                "refund": refunded,
                "payer_total": total,
                "payer_refund": refunded,
                "currency": "CNY",
            },
        },
    )


# -- the buyer's page ------------------------------------------------------------


def _page(title: str, parts: list[str], status: int = 200) -> web.Response:
    """A small page without any script or inline style (the CSP allows neither)."""
    body = "\n".join(parts)
    text = (
        '<!doctype html>\n<html lang="zh-CN">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta name="robots" content="noindex">\n<title>{html.escape(title)}</title>\n'
        f"</head>\n<body>\n<main>\n<h1>{html.escape(title)}</h1>\n{body}\n</main>\n</body>\n</html>\n"
    )
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        headers={"Cache-Control": "no-store"},
    )


def _same_origin(url: str, other: str) -> bool:
    a, b = urlsplit(url), urlsplit(other)
    return bool(a.scheme) and (a.scheme, a.netloc) == (b.scheme, b.netloc)


async def _checkout_trade(
    request: web.Request,
) -> tuple[FakeGateway, str, dict[str, str]]:
    fake = request.app[FAKE_GATEWAY]
    provider, order_id = request.match_info["provider"], request.match_info["order_id"]
    trade = await fake.trade(order_id)
    if trade is None or trade["provider"] != provider:
        raise web.HTTPNotFound(text="no such fake trade")
    return fake, order_id, trade


async def checkout_page(request: web.Request) -> web.Response:
    """GET /fake-pay/{provider}/checkout/{oid}: the amount, "pay" and "cancel"."""
    _, order_id, trade = await _checkout_trade(request)
    zh, en = PROVIDER_NAMES[trade["provider"]]
    back = request.query.get("redirect_url", "")
    hidden = f'<input type="hidden" name="redirect_url" value="{html.escape(back)}">'
    action = f"{PREFIX}/{trade['provider']}/checkout/{order_id}"
    parts = [
        "<p>这是开发和测试用的模拟支付，不会发生真实扣款。</p>",
        '<p lang="en">A fake payment for development and tests: no money moves.</p>',
        f"<p>{html.escape(trade['subject'])}</p>",
        f"<p>金额 Amount: <strong>¥{alipay.yuan(int(trade['total']))}</strong></p>",
        f"<p>订单号 Order: <code>{html.escape(order_id)}</code></p>",
    ]
    if trade["status"] == "created":
        parts += [
            f'<form method="post" action="{action}/pay">{hidden}'
            '<button type="submit">支付 Pay</button></form>',
            f'<form method="post" action="{action}/cancel">{hidden}'
            '<button type="submit">取消 Cancel</button></form>',
        ]
    else:
        parts.append("<p>已支付 Paid.</p>")
    return _page(f"模拟{zh} · Fake {en}", parts)


async def _back_url(request: web.Request, trade: Mapping[str, str]) -> str:
    """Where the browser returns: Alipay's return_url, WeChat H5's redirect_url.

    Read before anything is paid: a form that cannot be read pays nothing.
    """
    form = await _form(request)
    if trade["return_url"]:
        return trade["return_url"]
    back = form.get("redirect_url", "")
    # Only back to the merchant that created the order: never an open redirect.
    if isinstance(back, str) and _same_origin(back, trade["notify_url"]):
        return back
    return ""


async def checkout_pay(request: web.Request) -> web.StreamResponse:
    """The "pay" button: mark paid, send the notice, back to the merchant."""
    fake, order_id, trade = await _checkout_trade(request)
    back = await _back_url(request, trade)
    delivery = await fake.pay(order_id)
    if delivery is not None and delivery.status not in (200, 204):
        _LOGGER.warning("fake-pay notice for %s answered %s", order_id, delivery.status)
    raise web.HTTPSeeOther(back or f"{PREFIX}/{trade['provider']}/checkout/{order_id}")


async def checkout_cancel(request: web.Request) -> web.StreamResponse:
    """The "cancel" button: back to the merchant, nothing paid."""
    _, _, trade = await _checkout_trade(request)
    back = await _back_url(request, trade)
    if back:
        raise web.HTTPSeeOther(back)
    return _page("已取消 · Cancelled", ["<p>没有付款。 Nothing was paid.</p>"])


def fake_routes() -> list[web.RouteDef]:
    """The fake providers' routes (absolute paths under /fake-pay)."""
    checkout = (
        PREFIX + "/{provider:alipay|wechatpay}/checkout/{order_id:[0-9A-Za-z_-]{1,64}}"
    )
    wechat = PREFIX + "/wechatpay/v3"
    return [
        web.get(PREFIX + "/alipay/gateway.do", alipay_gateway, allow_head=False),
        web.post(PREFIX + "/alipay/gateway.do", alipay_gateway),
        web.post(wechat + "/pay/transactions/{kind:native|h5}", wechat_create),
        web.get(
            wechat + "/pay/transactions/out-trade-no/{order_id}",
            wechat_query,
            allow_head=False,
        ),
        web.post(wechat + "/refund/domestic/refunds", wechat_refund),
        web.get(checkout, checkout_page),
        web.post(checkout + "/pay", checkout_pay),
        web.post(checkout + "/cancel", checkout_cancel),
    ]


def setup_fake_provider(app: web.Application) -> None:
    """Register the fake's routes; they find the gateway at app[FAKE_GATEWAY]."""
    app.router.add_routes(fake_routes())


def fake_gateway_app(gateway: FakeGateway) -> web.Application:
    """A standalone app of only the fake providers (tests run it on loopback)."""
    app = web.Application()
    app[FAKE_GATEWAY] = gateway
    setup_fake_provider(app)
    return app
