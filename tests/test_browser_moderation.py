"""Content safety in a real browser: the report dialog for visitors, refusals in words.

The app listens on a real TCP port with its embedded worker on the demo
upstream; one image is generated and published through the API, then a
visitor (no session) reports it with the keyboard alone, and a signed-in
person sees a blocked prompt explained.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import Browser, Page, Route, async_playwright, expect
from redis.asyncio import Redis

from service.app import create_app
from service.moderation.log import ModerationLog
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
from .conftest import GENEROUS_LIMITS, TEST_SECRET
from .ports import free_port
from .processes import studio_environ
from .workbench import (
    new_address,
    sign_in as sign_in_api,
    studio_command,
    wait_for_status,
)

if not CHROMIUM.exists():
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")

Client = TestClient[web.Request, web.Application]


@dataclass
class Stage:
    """The running service, one published work and a browser."""

    url: str
    redis_url: str
    browser: Browser
    client: Client
    mail: MailCatcher
    work: dict[str, Any]
    media: Path
    axe: dict[str, Any] = field(default_factory=dict)

    async def context_page(
        self, viewport: Any = DESKTOP, locale: str = "en-US"
    ) -> tuple[Page, Watch]:
        """Open a fresh context (no cookie, no storage) and a watched page."""
        context = await self.browser.new_context(viewport=viewport, locale=locale)
        seen = watch(context, self.url)
        return await context.new_page(), seen


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def stage(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Stage]:
    """Serve the real app with its embedded worker; publish one generated image."""
    redis = Redis.from_url(redis_server.url)
    await redis.flushdb()
    await redis.aclose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    media = tmp_path_factory.mktemp("safety") / "media"
    settings = load_settings(
        {
            **GENEROUS_LIMITS,
            "STUDIO_REDIS_URL": redis_server.url,
            "STUDIO_BASE_URL": url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            "STUDIO_DEMO_UPSTREAM": "1",
            "STUDIO_DEMO_SECONDS": "0.5",
            "STUDIO_SQUARE_READ_BUDGET": "1",
            "STUDIO_MEDIA_DIR": str(media),
        }
    )
    client: Client = TestClient(
        TestServer(create_app(settings, embedded_worker=True), port=port)
    )
    await client.start_server()
    try:
        await sign_in_api(client, mail_server)
        response = await client.post(
            "/api/generations",
            json={"model": "seedream-4", "prompt": "a paper boat on a pond"},
        )
        assert response.status == 202, await response.text()
        gid = (await response.json())["id"]
        done = await wait_for_status(client, gid, {"succeeded"}, 60)
        work = done["works"][0]
        published = await client.post(f"/api/works/{work['id']}/publish")
        assert published.status == 200
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            yield Stage(
                url, redis_server.url, browser, client, mail_server, work, media
            )
            await browser.close()
    finally:
        await client.close()


async def _open_the_work(stage: Stage, page: Page) -> None:
    await page.goto(f"{stage.url}/studio")
    tile = page.locator(f'#square-grid > li[data-id="{stage.work["id"]}"]')
    await tile.get_by_role("button").click()
    await expect(page.locator("#viewer")).to_be_visible()


async def test_a_visitor_reports_a_square_work_with_the_keyboard(stage: Stage) -> None:
    """Report → category → reason → send: the id at once; Escape and focus behave."""
    page, seen = await stage.context_page()
    await _open_the_work(stage, page)
    viewer, dialog = page.locator("#viewer"), page.locator("#report")
    report = viewer.get_by_role("button", name="Report")
    await report.focus()
    await page.keyboard.press("Enter")
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("decided within 24 hours")
    # The first category has the focus; arrows move among them, as radios do.
    await expect(dialog.get_by_role("radio", name="Illegal content")).to_be_focused()
    await page.keyboard.press("ArrowDown")
    await expect(dialog.get_by_role("radio", name="Sexual content")).to_be_checked()
    await page.keyboard.press("Tab")
    await expect(page.locator("#r-reason")).to_be_focused()
    # Sending with no reason says so, and sends nothing.
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    await expect(page.locator("#r-error")).to_contain_text("Reason")
    await expect(page.locator("#r-reason")).to_be_focused()
    await page.keyboard.type("Shows a real person without consent")
    await screenshot(page, "report")
    await assert_accessible(page, "report", stage.axe)
    await page.keyboard.press("Tab")
    await page.keyboard.press("Enter")
    done = page.locator("#r-done-text")
    await expect(done).to_contain_text("Your report is received (number ")
    await expect(page.locator("#r-done button")).to_be_focused()
    await screenshot(page, "report-received")
    await assert_accessible(page, "report-received", stage.axe)
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await expect(viewer).to_be_visible()  # only the report dialog closed
    await expect(report).to_be_focused()
    redis = Redis.from_url(stage.redis_url)
    try:
        records = [r async for r in ModerationLog(redis, 180).read()]
    finally:
        await redis.aclose()
    (record,) = [r for r in records if r["source"] == "report"]
    assert (record["work"], record["field"]) == (stage.work["id"], "sexual")
    assert record["text"] == "Shows a real person without consent"
    assert record["report"] in (await done.text_content() or "")
    await page.context.close()
    seen.assert_clean()


async def test_a_reporter_sees_in_the_dialog_how_each_report_was_decided(
    stage: Stage,
) -> None:
    """This browser's reports, received then decided; an unknown id is dropped."""
    page, seen = await stage.context_page()
    await page.goto(f"{stage.url}/studio")
    forged = "A" * 20  # kept by this browser, unknown to the server
    seen.expect_status(404, f"/api/reports/{forged}")
    await page.evaluate(
        "(id) => localStorage.setItem('studio.reports', JSON.stringify([id]))", forged
    )
    # The listing made when the dialog opens hears of the forged id only after
    # the report is sent (a slow network): it must not forget the new one.
    release, asked = asyncio.Event(), []

    async def held_once(route: Route) -> None:
        asked.append(route.request.url)
        if len(asked) == 1:
            await release.wait()
        await route.continue_()

    await page.route(f"**/api/reports/{forged}", held_once)
    await _open_the_work(stage, page)
    viewer, dialog = page.locator("#viewer"), page.locator("#report")
    await viewer.get_by_role("button", name="Report").click()
    mine = page.locator("#r-mine-list > li")
    await expect(dialog.get_by_role("heading", name="Your reports")).to_be_hidden()
    await page.locator("#r-reason").fill("Copies my photograph")
    await dialog.get_by_role("button", name="Send report").click()
    await expect(page.locator("#r-done-text")).to_contain_text("number ")
    await expect(mine).to_have_count(1)
    release.set()
    await page.wait_for_function(
        "() => !localStorage.getItem('studio.reports').includes('AAAA')"
    )
    await expect(mine).to_have_count(1)
    rid = await mine.get_attribute("data-report")
    assert rid is not None
    assert rid in (await page.locator("#r-done-text").text_content() or "")
    await expect(mine).to_contain_text(f"Number {rid}: received ")
    await expect(mine).to_contain_text(", to be decided by ")
    stored = await page.evaluate("() => localStorage.getItem('studio.reports')")
    assert stored == f'["{rid}"]'  # the forged id forgotten
    await page.keyboard.press("Escape")

    environ = studio_environ(
        STUDIO_REDIS_URL=stage.redis_url,
        STUDIO_SECRET_KEY=TEST_SECRET,
        STUDIO_MEDIA_DIR=str(stage.media),
    )
    done = await studio_command(
        "reports", "resolve", rid, "keep", "--note", "own work", environ=environ
    )
    assert done.returncode == 0, done.stderr
    await viewer.get_by_role("button", name="Report").click()
    await expect(mine).to_have_count(1)
    await expect(mine).to_contain_text(f"Number {rid}: decided ")
    await expect(mine).to_contain_text(", the work stays")
    await expect(dialog.get_by_role("heading", name="Your reports")).to_be_visible()
    await screenshot(page, "report-decided")
    await assert_accessible(page, "report-decided", stage.axe)
    await page.context.close()
    seen.assert_clean()


async def test_the_report_dialog_fits_a_phone_in_chinese(stage: Stage) -> None:
    """At 360 px, in Chinese: the categories stack, nothing overflows, axe is clean,
    with one earlier report listed under the form."""
    filed = await stage.client.post(
        f"/api/square/{stage.work['id']}/report",
        json={"reason": "与我的作品雷同", "category": "infringement"},
    )
    assert filed.status == 202
    rid = (await filed.json())["id"]
    page, seen = await stage.context_page(MOBILE, "zh-CN")
    await _open_the_work(stage, page)
    await page.evaluate(
        "(id) => localStorage.setItem('studio.reports', JSON.stringify([id]))", rid
    )
    await page.locator("#viewer").get_by_role("button", name="举报").click()
    dialog = page.locator("#report")
    await expect(dialog).to_contain_text("24 小时内处理")
    await expect(page.locator("#r-mine-list > li")).to_contain_text(
        f"编号 {rid}：已受理"
    )
    width = await page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 360
    box = await dialog.bounding_box()
    assert box is not None
    assert box["x"] >= 0
    assert box["x"] + box["width"] <= 360
    await screenshot(page, "report-zh")
    await assert_accessible(page, "report-zh-mobile", stage.axe)
    # The list is below the form: the dialog scrolls to it, and it fits too.
    listed = page.locator("#r-mine-list > li")
    await listed.scroll_into_view_if_needed()
    await expect(listed).to_be_in_viewport()
    item = await listed.bounding_box()
    assert item is not None
    assert box["x"] <= item["x"]
    assert item["x"] + item["width"] <= box["x"] + box["width"]
    await screenshot(page, "report-zh-listed")
    await page.context.close()
    seen.assert_clean()


async def test_a_blocked_prompt_is_explained_in_words_and_charges_nothing(
    stage: Stage,
) -> None:
    """The create form says what happened; the balance stays as it was."""
    page, seen = await stage.context_page()
    seen.expect_status(400, "/api/generations")
    await page.goto(f"{stage.url}/studio")
    await sign_in(page, stage.mail, new_address())
    await page.get_by_role("button", name="Get started").click()
    balance = page.locator("#balance-value")
    await expect(balance).to_have_text("100")
    await page.get_by_role("link", name="Create").click()
    await page.locator("#c-model").select_option("seedream-4")
    await page.locator("#c-prompt").fill("兒童 色情")
    await page.locator("#c-prompt").press("Control+Enter")
    error = page.locator("#c-error")
    await expect(error).to_contain_text("may not be generated")
    await expect(error).to_contain_text("Nothing was charged")
    await expect(page.locator("#jobs > li")).to_have_count(0)
    await expect(balance).to_have_text("100")
    await error.scroll_into_view_if_needed()
    await screenshot(page, "create-blocked")
    await assert_accessible(page, "create-blocked", stage.axe)
    await page.context.close()
    seen.assert_clean()
