"""Buying credits in a real browser on the fake provider: a QR code, then a redirect.

The app listens on a real TCP port with `payments.fake` on and its embedded
worker; the fake checkout pages, the signed notices they send to the webhooks
and the event stream that tells the workbench are all the real code paths.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import (
    Browser,
    Frame,
    Page,
    ViewportSize,
    async_playwright,
    expect,
)
from redis.asyncio import Redis

from service.app import create_app
from service.payments.fake import FAKE_GATEWAY
from service.settings import load_settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import LEDGER

from .browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DESKTOP,
    MOBILE,
    SKIP_REASON,
    Watch,
    assert_accessible,
    screenshot,
    sign_in,
    watch,
)
from .conftest import GENEROUS_LIMITS, TEST_SECRET
from .ports import free_port
from .workbench import new_address

if not CHROMIUM.exists():
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")

Client = TestClient[web.Request, web.Application]
PAY_BUTTON = "支付 Pay"


@dataclass
class Shop:
    """The running service with the fake provider, and a browser."""

    url: str
    browser: Browser
    client: Client
    mail: MailCatcher
    axe: dict[str, Any] = field(default_factory=dict)

    async def context_page(
        self, viewport: ViewportSize = DESKTOP, locale: str = "en-US"
    ) -> tuple[Page, Watch]:
        """Open a fresh context (no cookie, no storage) and a watched page in it."""
        context = await self.browser.new_context(viewport=viewport, locale=locale)
        seen = watch(context, self.url)
        page = await context.new_page()
        return page, seen


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def shop(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Shop]:
    """Serve the real app with payments.fake on a free port, and start Chromium."""
    redis = Redis.from_url(redis_server.url)
    await redis.flushdb()
    await redis.aclose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = load_settings(
        {
            **GENEROUS_LIMITS,
            "STUDIO_REDIS_URL": redis_server.url,
            "STUDIO_BASE_URL": url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            "STUDIO_DEMO_UPSTREAM": "1",
            "STUDIO_PAYMENTS_FAKE": "1",
            "STUDIO_MEDIA_DIR": str(tmp_path_factory.mktemp("shop") / "media"),
        }
    )
    app = create_app(settings, embedded_worker=True)
    client: Client = TestClient(TestServer(app, port=port))
    await client.start_server()
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            yield Shop(url, browser, client, mail_server)
            await browser.close()
    finally:
        await client.close()


async def uncut(page: Page, selector: str) -> bool:
    """Tell whether an element shows all of its content (none scrolled or clipped)."""
    return bool(
        await page.locator(selector).evaluate(
            "(el) => el.scrollWidth <= el.clientWidth"
        )
    )


def is_order_post(response: Any) -> bool:
    """Tell the answer to the page's POST /api/orders apart from the rest."""
    return bool(
        response.url.endswith("/api/orders") and response.request.method == "POST"
    )


async def test_a_person_buys_credits_by_qr_code_and_by_redirect_and_sees_them_arrive(
    shop: Shop,
) -> None:
    """A QR paid from a phone lands live; Alipay comes back to the return page."""
    page, seen = await shop.context_page()
    await page.goto(f"{shop.url}/studio")
    await sign_in(page, shop.mail, new_address())
    await page.get_by_role("button", name="Get started").click()
    balance = page.locator("#balance-value")
    await expect(balance).to_have_text("100")

    # Buy credits: the four packs with their bonus, the two channels.
    await page.locator("#buy-link").click()
    await expect(page.locator("#h-buy")).to_be_focused()
    packs = page.locator("#buy-packs .pack")
    await expect(packs).to_have_count(4)
    await expect(packs.nth(1)).to_contain_text("¥98")
    await expect(packs.nth(1)).to_contain_text("980 credits")
    await expect(packs.nth(1)).to_contain_text("+80 bonus")
    await expect(packs.nth(0)).to_contain_text("No bonus")
    await expect(page.locator("#buy-channels input")).to_have_count(2)
    await expect(page.locator("#orders tr")).to_have_text("No orders yet.")
    assert await uncut(page, ".tabs"), "the entry must not push the tabs out of sight"
    await screenshot(page, "buy")
    await assert_accessible(page, "buy", shop.axe)

    # WeChat Pay on a desktop: a QR code, and a page that waits without reloading.
    navigations: list[str] = []

    def navigated(frame: Frame) -> None:
        if frame == page.main_frame:
            navigations.append(frame.url)

    page.on("framenavigated", navigated)
    await page.evaluate("() => { window.stayedHere = true; }")
    # The packs are one radio group: the arrow keys move the choice.
    await page.get_by_role("radio", name=re.compile(r"^¥30\b")).focus()
    await page.keyboard.press("ArrowRight")
    await expect(page.get_by_role("radio", name=re.compile(r"^¥98\b"))).to_be_checked()
    await page.get_by_role("radio", name="WeChat Pay").check()
    async with page.expect_response(is_order_post) as answer:
        await page.get_by_role("button", name="Pay ¥98").click()
    wechat = await (await answer.value).json()
    assert wechat["action"]["type"] == "qrcode"
    qr = page.locator("#buy-qr-img")
    await expect(qr).to_be_visible()
    await expect(qr).to_have_attribute("src", f"/api/orders/{wechat['id']}/qrcode")
    await expect(qr).to_have_attribute("alt", "WeChat Pay QR code for ¥98")
    assert await qr.evaluate("(img) => img.decode().then(() => img.complete)")
    await expect(page.locator("#buy-order-what")).to_have_text(
        "980 + 80 credits · ¥98 · WeChat Pay"
    )
    state = page.locator("#buy-order-state")
    await expect(state).to_have_text(re.compile(r"^Waiting for payment\."))
    await expect(page.locator("#buy-form")).to_be_hidden()
    await expect(page.locator(f"#orders tr[data-id='{wechat['id']}']")).to_contain_text(
        "Awaiting payment"
    )
    await screenshot(page, "buy-qr")
    await assert_accessible(page, "buy-qr", shop.axe)

    # The phone: another browser, no session, opens what the QR code says and pays.
    phone, phone_seen = await shop.context_page(viewport=MOBILE)
    # The fake's checkout page names no icon, so the browser asks for /favicon.ico.
    phone_seen.expect_status(404, "/favicon.ico")
    await phone.goto(wechat["action"]["code_url"])
    await expect(phone.locator("body")).to_contain_text("98")
    await phone.get_by_role("button", name=PAY_BUTTON).click()
    await phone.wait_for_load_state()

    await expect(balance).to_have_text("1,160")  # 100 + 980 + 80, from the stream
    await expect(state).to_have_text("Paid: 1,060 credits credited.")
    await expect(page.locator("#buy-qr")).to_be_hidden()
    await expect(page.locator(f"#orders tr[data-id='{wechat['id']}']")).to_contain_text(
        "Paid"
    )
    assert await page.evaluate("() => window.stayedHere === true")
    assert navigations == []
    await expect(page.locator("#buy-form")).to_be_visible()
    await screenshot(page, "buy-paid")
    await assert_accessible(page, "buy-paid", shop.axe)

    # Alipay: the provider's page (the fake), pay, and back to the return page.
    await page.get_by_role("radio", name=re.compile(r"^¥30\b")).check()
    await page.get_by_role("radio", name="Alipay").check()
    await page.get_by_role("button", name="Pay ¥30").click()
    # The order's action was a redirect: the page went to the provider (the fake).
    checkout = re.compile(r"/fake-pay/alipay/checkout/([0-9a-f]{32})$")
    await page.wait_for_url(checkout)
    found = checkout.search(page.url)
    assert found is not None
    alipay = {"id": found.group(1)}
    await expect(page.locator("body")).to_contain_text("30")
    await page.get_by_role("button", name=PAY_BUTTON).click()
    await expect(page.locator("#view-buy")).to_be_visible()
    assert f"{shop.url}/studio?order={alipay['id']}#buy" in navigations
    await expect(state).to_have_text("Paid: 300 credits credited.")
    await expect(balance).to_have_text("1,460")
    # The return page forgets the order in its address, so a reload waits no more.
    await expect(page).to_have_url(f"{shop.url}/studio#buy")

    # My orders, newest first, both paid.
    rows = page.locator("#orders tr")
    await expect(rows).to_have_count(2)
    await expect(rows.nth(0)).to_have_attribute("data-id", alipay["id"])
    await expect(rows.nth(0)).to_contain_text("300 credits")
    await expect(rows.nth(0)).to_contain_text("Alipay")
    await expect(rows.nth(1)).to_have_attribute("data-id", wechat["id"])
    for n in (0, 1):
        await expect(rows.nth(n).locator(".ostatus")).to_have_text("Paid")

    # In Chinese, every word of the view follows.
    await page.get_by_label("Language").select_option("zh")
    await expect(page.locator("#buy-submit")).to_have_text("支付 ¥30")
    await expect(page.get_by_role("radio", name="支付宝")).to_be_checked()
    await expect(state).to_have_text("已付款，300 积分已到账。")
    await expect(rows.nth(1).locator(".ostatus")).to_have_text("已付款")
    await expect(rows.nth(1)).to_contain_text("980 + 80 积分")
    await page.get_by_label("语言").select_option("en")

    # The same screen on a phone fits 360 px, the brand still whole beside the entry.
    await page.set_viewport_size(MOBILE)
    width = await page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= MOBILE["width"], f"the buy view is {width} px wide"
    assert await uncut(page, ".brand")
    await expect(page.get_by_role("link", name="Buy credits").first).to_be_visible()
    await expect(page.locator("#toast")).not_to_have_class(re.compile("show"))
    await screenshot(page, "buy")
    await assert_accessible(page, "buy-mobile", shop.axe)

    await phone.context.close()
    await page.context.close()
    seen.assert_clean()
    phone_seen.assert_clean()


async def buy_by_redirect(page: Page, yuan: int) -> str:
    """Buy a pack with Alipay on the fake's page and come back; return the order id."""
    await page.locator("#buy-link").click()
    await page.get_by_role("radio", name=re.compile(rf"^¥{yuan}\b")).check()
    await page.get_by_role("radio", name="Alipay").check()
    await page.get_by_role("button", name=f"Pay ¥{yuan}").click()
    checkout = re.compile(r"/fake-pay/alipay/checkout/([0-9a-f]{32})$")
    await page.wait_for_url(checkout)
    found = checkout.search(page.url)
    assert found is not None
    await page.get_by_role("button", name=PAY_BUTTON).click()
    await expect(page.locator("#buy-order-state")).to_have_text(re.compile(r"^Paid: "))
    return found.group(1)


async def test_a_refund_at_the_provider_holds_generation_until_a_purchase_settles_it(
    shop: Shop,
) -> None:
    """Spent credits refunded at the provider are owed, said in words, then settled."""
    page, seen = await shop.context_page()
    seen.expect_status(402, "/api/generations")
    await page.goto(f"{shop.url}/studio")
    await sign_in(page, shop.mail, new_address())
    await page.get_by_role("button", name="Get started").click()
    balance = page.locator("#balance-value")
    order = await buy_by_redirect(page, 30)
    await expect(balance).to_have_text("400")

    # 360 spent: the 100 trial credits first, then 260 of the 300 bought.
    for n in range(3):
        spent = await page.request.post(
            f"{shop.url}/api/generations",
            data={"model": "kling-2-1", "prompt": f"a long shot of a pier, take {n}"},
        )
        assert spent.status == 202, await spent.text()
    await expect(balance).to_have_text("40")

    # The whole ¥30 refunded in the merchant console: 40 taken back, 260 owed.
    sent = await shop.client.app[FAKE_GATEWAY].refund_from_console(order, 3000)
    assert sent.status == 200, sent.answer
    await expect(balance).to_have_text("0")
    row = page.locator(f"#orders tr[data-id='{order}']")
    await expect(row.locator(".ostatus")).to_have_text("Refunded")
    await expect(row).to_contain_text("¥30.00")
    hold = page.locator("#buy-hold")
    owed = (
        "A refund made at the payment provider took back credits you had already"
        " spent: 260 credits are owed. The next purchase settles them and"
        " generation resumes."
    )
    await expect(hold).to_be_visible()
    await expect(hold).to_contain_text(owed)
    await screenshot(page, "buy-hold")
    await assert_accessible(page, "buy-hold", shop.axe)

    # Credits granted meanwhile lift no hold: submitting says why, in the same words.
    me = await (await page.request.get(f"{shop.url}/api/me")).json()
    await shop.client.app[LEDGER].adjust(me["id"], 50, "goodwill")
    await expect(balance).to_have_text("50")
    await page.get_by_role("link", name="Create").click()
    await page.locator("#c-model").select_option("seedream-4")
    await page.locator("#c-prompt").fill("a kite over a field")
    async with page.expect_response(f"{shop.url}/api/generations") as refused:
        await page.locator("#c-submit").click()
    assert (await refused.value).status == 402
    await expect(page.locator("#c-error")).to_have_text(owed)

    # The next purchase settles the 260 first: 50 + 1,060 - 260.
    await buy_by_redirect(page, 98)
    await expect(balance).to_have_text("850")
    await expect(hold).to_be_hidden()
    await page.context.close()
    seen.assert_clean()
