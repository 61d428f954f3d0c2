"""My account in a real browser: export and download, delete, sign in to restore.

The app listens on a real TCP port with its embedded worker (generations, the
export job, the purger) on the demo upstream and the fake payment provider; the
codes come from the test's SMTP server, the ZIP is the one the browser saved.
"""

from __future__ import annotations

import json
import re
import zipfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import Browser, Page, async_playwright, expect
from redis.asyncio import Redis

from service.app import create_app
from service.keys import SETTINGS
from service.settings import load_settings
from service.store.embedded import MailCatcher, RedisServer

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
from .conftest import GENEROUS_LIMITS, TEST_SECRET, latest_code
from .ports import free_port
from .workbench import new_address

if not CHROMIUM.exists():
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")

Client = TestClient[web.Request, web.Application]
PAY_BUTTON = "支付 Pay"
# One address signs in, confirms a deletion and signs in again within a minute.
CODE_LIMITS = {
    f"STUDIO_LIMITS_{name}_{field}": value
    for name in ("CODE_COOLDOWN", "CODE_EMAIL_HOUR", "CODE_DEVICE_COOLDOWN",
                 "CODE_DEVICE_HOUR")
    for field, value in (("QUOTA", "1000"), ("BURST", "500"))
}  # fmt: skip


@dataclass
class Desk:
    """The running service and a browser."""

    url: str
    browser: Browser
    client: Client
    mail: MailCatcher
    axe: dict[str, Any] = field(default_factory=dict)

    async def context_page(self) -> tuple[Page, Watch]:
        """Open a fresh English context (no cookie, no storage) and a watched page."""
        context = await self.browser.new_context(viewport=DESKTOP, locale="en-US")
        seen = watch(context, self.url)
        page = await context.new_page()
        return page, seen


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def desk(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Desk]:
    """Serve the real app with its embedded worker on a free port; start Chromium."""
    redis = Redis.from_url(redis_server.url)
    await redis.flushdb()
    await redis.aclose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    settings = load_settings(
        {
            **GENEROUS_LIMITS,
            **CODE_LIMITS,
            "STUDIO_REDIS_URL": redis_server.url,
            "STUDIO_BASE_URL": url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            "STUDIO_DEMO_UPSTREAM": "1",
            "STUDIO_DEMO_SECONDS": "1",
            "STUDIO_SQUARE_READ_BUDGET": "1",
            "STUDIO_PAYMENTS_FAKE": "1",
            "STUDIO_MEDIA_DIR": str(tmp_path_factory.mktemp("account") / "media"),
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
            yield Desk(url, browser, client, mail_server)
            await browser.close()
    finally:
        await client.close()


@asynccontextmanager
async def mail_running_low(desk: Desk, redis_url: str) -> AsyncIterator[None]:
    """Spend the free part of the mail budget: code requests need a proof of work."""
    app = desk.client.app
    assert app is not None
    free = app[SETTINGS].limits["mail-free"]
    key = "studio:rl:v1:{all}:mail-free"
    redis = Redis.from_url(redis_url)
    seconds, micros = await redis.time()
    full = free.burst * free.interval_us
    await redis.set(key, seconds * 1_000_000 + micros + full, px=full // 1000)
    try:
        yield
    finally:
        await redis.delete(key)
        await redis.aclose()


async def make_a_work(page: Page, prompt: str) -> None:
    """Generate one image through the create form and wait for it."""
    await page.get_by_role("link", name="Create").click()
    await page.locator("#c-model").select_option("seedream-4")
    await page.locator("#c-prompt").fill(prompt)
    await page.locator("#c-prompt").press("Control+Enter")
    job = page.locator("#jobs > li").first
    await expect(job).to_contain_text(prompt)
    await expect(job).to_have_attribute("data-status", "succeeded", timeout=20_000)


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


async def whole_page_screenshot(page: Page, screen: str) -> None:
    """Write the screenshot as tall as the page, then give the viewport back."""
    viewport = page.viewport_size
    assert viewport is not None
    height = await page.evaluate("() => document.documentElement.scrollHeight")
    await page.set_viewport_size({"width": viewport["width"], "height": height})
    await screenshot(page, screen)
    await page.set_viewport_size(viewport)


async def fits_a_phone(page: Page) -> None:
    """The page scrolls no wider than 360 px and the tabs all show."""
    await page.set_viewport_size(MOBILE)
    width = await page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= MOBILE["width"], f"the account view is {width} px wide"
    tabs = page.locator(".tabs")
    assert await tabs.evaluate("(el) => el.scrollWidth <= el.clientWidth")


async def test_a_person_exports_downloads_deletes_and_signing_in_again_restores(
    desk: Desk, redis_server: RedisServer
) -> None:
    """Export and download the ZIP, delete with a mailed code, then come back."""
    page, seen = await desk.context_page()
    # The fake's checkout page names no icon, so the browser asks for /favicon.ico.
    seen.expect_status(404, "/favicon.ico")
    email = new_address()
    await page.goto(f"{desk.url}/studio")
    await sign_in(page, desk.mail, email)
    await page.get_by_role("button", name="Get started").click()
    balance = page.locator("#balance-value")
    await expect(balance).to_have_text("100")
    await make_a_work(page, "a lighthouse keeper's cat at dawn")
    await expect(balance).to_have_text("94")
    order = await buy_by_redirect(page, 30)
    await expect(balance).to_have_text("394")

    # The account: who I am, what I hold, and what deleting would cost.
    await page.get_by_role("link", name="Account").click()
    await expect(page.locator("#h-account")).to_be_focused()
    await expect(page.locator("#a-email")).to_have_text(email)
    await expect(page.locator("#a-balance")).to_have_text("394")
    await expect(page.locator("#a-owed")).to_have_text("None")
    refund = page.locator(f"#a-refund-list li[data-id='{order}']")
    await expect(refund).to_contain_text("300 credits refundable, ¥30.00 back")
    await expect(refund).to_contain_text(order)
    await expect(page.locator("#a-forfeit")).to_have_text(
        "Your balance of 394 credits is forfeited, 300 of them purchased."
    )
    # The refundable orders come before the consequences and the button.
    assert await page.evaluate(
        """() => {
            const first = document.getElementById('a-refundable');
            const button = document.getElementById('a-delete-start');
            return Boolean(first.compareDocumentPosition(button)
                & Node.DOCUMENT_POSITION_FOLLOWING);
        }"""
    )
    await expect(page.locator("#toast")).not_to_have_class(re.compile("show"))
    await whole_page_screenshot(page, "account")
    await assert_accessible(page, "account", desk.axe)

    # Export: asked, packed by the worker, told by the stream, downloaded.
    await page.get_by_role("button", name="Export my data").click()
    link = page.get_by_role("link", name="Download the ZIP")
    await expect(link).to_be_visible(timeout=30_000)
    await expect(page.locator("#a-export-expiry")).to_have_text(
        re.compile(r"^available until ")
    )
    async with page.expect_download() as saving:
        await link.click()
    download = await saving.value
    saved = await download.path()
    with zipfile.ZipFile(saved) as archive:
        names = set(archive.namelist())
        account = json.loads(archive.read("account.json"))
    assert {"account.json", "works.json", "README.txt"} <= names
    assert account["email"] == email
    assert any(name.startswith("media/") for name in names)

    # A second export the same day is refused, and the page says until when.
    seen.expect_status(429, "/api/account/export")
    await page.get_by_role("button", name="Export my data").click()
    await expect(page.locator("#a-export-error")).to_have_text(
        re.compile(r"^One export every 24 hours: you can ask for the next one after ")
    )
    await expect(link).to_be_visible()

    # The same view on a phone.
    await fits_a_phone(page)
    await whole_page_screenshot(page, "account")
    await assert_accessible(page, "account-mobile", desk.axe)
    await page.set_viewport_size(DESKTOP)

    # Delete: a code for my own address (through a proof of work, as mail runs
    # low), a wrong code first, then the right one.
    seen.expect_status(400, "/api/account/delete")
    seen.expect_status(429, "/api/auth/code")
    asked: list[tuple[int, dict[str, Any]]] = []

    def on_response(response: Any) -> None:
        if response.url.endswith("/api/auth/code"):
            asked.append((response.status, response.request.post_data_json))

    page.on("response", on_response)
    code = page.locator("#a-code")
    async with mail_running_low(desk, redis_server.url):
        await page.get_by_role(
            "button", name="E-mail me a code to delete my account"
        ).click()
        await expect(code).to_be_focused(timeout=30_000)
    assert [status for status, _ in asked] == [429, 200]
    assert asked[1][1]["email"] == email
    assert "altcha" in asked[1][1]
    await expect(page.locator("#a-delete-sent")).to_contain_text(email)
    digits = latest_code(desk.mail, email)
    wrong = f"{(int(digits) + 1) % 100_000_000:08d}"
    await code.fill(wrong)
    await page.get_by_role("button", name="Delete my account", exact=True).click()
    await expect(page.locator("#a-delete-error")).to_have_text(
        "That code is wrong or has expired. Please check it."
    )
    await expect(page.locator("#signout-button")).to_be_visible()
    await code.fill(f"{digits[:4]} {digits[4:]}")
    await code.press("Enter")

    # Signed out at once; the page says when the account goes and how to keep it.
    gone = page.locator("#account-gone")
    await expect(gone).to_be_visible()
    await expect(page.locator("#h-gone")).to_be_focused()
    await expect(page.locator("#account-gone-text")).to_have_text(
        re.compile(r"^You are signed out\. .* erased for good on .+\.$")
    )
    await expect(gone).to_contain_text("Signing in again with the same address")
    await expect(page.locator("#signin-button")).to_be_visible()
    await expect(page.locator("#balance")).to_be_hidden()
    cookies = await page.context.cookies()
    assert all(cookie["name"] != "studio_session" for cookie in cookies)
    await expect(page.locator("#toast")).not_to_have_class(re.compile("show"))
    await screenshot(page, "account-delete")
    await assert_accessible(page, "account-delete", desk.axe)

    # A reload still says so, without asking the server who I am.
    await page.reload()
    await expect(gone).to_be_visible()

    # Signing in again restores the account: the balance and the work are back.
    await page.get_by_role("button", name="Sign in to restore it").click()
    await sign_in(page, desk.mail, email)
    await expect(page.locator("#toast")).to_have_text(
        "Welcome back: your account is restored as it was."
    )
    await expect(balance).to_have_text("394")
    await expect(page.locator("#a-email")).to_have_text(email)
    await expect(gone).to_be_hidden()
    await page.get_by_role("link", name="My works").click()
    works = page.locator("#works-grid > li")
    await expect(works).to_have_count(1)
    await expect(works.first.locator("img")).to_have_attribute(
        "alt", "a lighthouse keeper's cat at dawn"
    )

    # In Chinese, the view's words follow.
    await page.get_by_role("link", name="Account").click()
    await page.get_by_label("Language").select_option("zh")
    await expect(page.locator("#h-account")).to_have_text("我的账户")
    await expect(page.locator("#a-forfeit")).to_have_text(
        "余额中的 394 积分全部作废，其中已购积分 300。"
    )
    await page.context.close()
    seen.assert_clean()


async def test_sign_out_everywhere_ends_every_session_of_the_account(
    desk: Desk,
) -> None:
    """Two browsers signed in; the button in one signs both out."""
    email = new_address()
    first, first_seen = await desk.context_page()
    second, second_seen = await desk.context_page()
    for page in (first, second):
        await page.goto(f"{desk.url}/studio#account")
        await sign_in(page, desk.mail, email)
    await first.get_by_role("button", name="Get started").click()
    await expect(first.locator("#a-email")).to_have_text(email)
    await first.get_by_role("button", name="Sign out everywhere").click()
    await expect(first.locator("#signin-button")).to_be_visible()
    await expect(first.locator("#toast")).to_have_text(
        "You are signed out on every device."
    )
    # The other browser learns at its next request (its stream ended with it).
    second_seen.expect_status(401, "/api/me")
    second_seen.expect_status(401, "/api/events")
    answer = await second.request.get(f"{desk.url}/api/me")
    assert answer.status == 401
    for page in (first, second):
        await page.context.close()
    first_seen.assert_clean()
    second_seen.assert_clean()
