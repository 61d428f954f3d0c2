"""The deeper workbench (CONTRACT §12) in a real browser: place in line, try again,
cancel all, search, collections, "use this prompt", presets and daily credits.

One app with its embedded worker running one job at a time (so a line forms),
one Chromium; each test opens its own contexts, watched for console errors,
failed requests and error answers it did not provoke.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from playwright.async_api import (
    Browser,
    Locator,
    Page,
    ViewportSize,
    async_playwright,
    expect,
)
from redis.asyncio import Redis

from service.app import create_app
from service.keys import SETTINGS
from service.settings import load_settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.positions import RUNS_KEY, WINDOW_SECONDS

from .browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DESKTOP,
    MOBILE,
    SKIP_REASON,
    Watch,
    assert_accessible,
    screenshot,
    watch,
)
from .conftest import GENEROUS_LIMITS, TEST_SECRET
from .ports import free_port
from .workbench import sign_in as sign_in_api, wait_for_status

if not CHROMIUM.exists():
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")

Client = TestClient[web.Request, web.Application]
DEMO_SECONDS = 1.5


@dataclass
class Bench:
    """The running service, a browser, and people signed in through the API."""

    url: str
    browser: Browser
    client: Client
    mail: MailCatcher
    axe: dict[str, Any] = field(default_factory=dict)
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)

    async def person(self) -> aiohttp.ClientSession:
        """A new account signed in through the real endpoints (its own cookie jar)."""
        session = aiohttp.ClientSession(
            base_url=self.url, cookie_jar=aiohttp.CookieJar(unsafe=True)
        )
        self.sessions.append(session)
        await sign_in_api(session, self.mail)  # type: ignore[arg-type]
        return session

    async def page_of(
        self,
        person: aiohttp.ClientSession | None,
        viewport: ViewportSize = DESKTOP,
        locale: str = "en-US",
    ) -> tuple[Page, Watch]:
        """A watched page in a fresh context, signed in as `person` (if any)."""
        context = await self.browser.new_context(viewport=viewport, locale=locale)
        seen = watch(context, self.url)
        if person is not None:
            await context.add_cookies(
                [
                    {"name": c.key, "value": c.value, "url": self.url, "httpOnly": True}
                    for c in person.cookie_jar
                ]
            )
            await context.add_init_script(
                "try { localStorage.setItem('studio.session', '1') } catch {}"
            )
        return await context.new_page(), seen


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def bench(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Bench]:
    """Serve the real app with one embedded worker slot; start Chromium."""
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
            "STUDIO_DEMO_SECONDS": str(DEMO_SECONDS),
            "STUDIO_WORKER_CONCURRENCY": "1",
            "STUDIO_JOBS_PER_USER": "8",
            "STUDIO_SQUARE_READ_BUDGET": "1",
            "STUDIO_MEDIA_DIR": str(tmp_path_factory.mktemp("bench") / "media"),
        }
    )
    client: Client = TestClient(
        TestServer(create_app(settings, embedded_worker=True), port=port)
    )
    await client.start_server()
    bench = None
    try:
        async with async_playwright() as playwright:
            browser = await playwright.chromium.launch(
                executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
            )
            bench = Bench(url, browser, client, mail_server)
            yield bench
            await browser.close()
    finally:
        for session in bench.sessions if bench else []:
            await session.close()
        await client.close()


async def _submit(person: aiohttp.ClientSession, **body: Any) -> dict[str, Any]:
    async with person.post(
        "/api/generations", json={"model": "seedream-4", **body}
    ) as response:
        assert response.status == 202, await response.text()
        generation: dict[str, Any] = await response.json()
        return generation


async def _finished(person: aiohttp.ClientSession, **body: Any) -> dict[str, Any]:
    generation = await _submit(person, **body)
    return await wait_for_status(person, generation["id"], {"succeeded"}, 60)  # type: ignore[arg-type]


async def _run_time_known(bench: Bench) -> None:
    """Wait until the worker has sent its first run time and serve may read it.

    The worker sends its run times once a second; each app process reads them
    again at most every WINDOW_SECONDS, so that much later every answer has one.
    """
    redis = Redis.from_url(bench.client.app[SETTINGS].redis_url)
    try:
        for _ in range(100):
            if await redis.exists(RUNS_KEY + "seedream-4"):
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the worker sent no run time within 10 s")
    finally:
        await redis.aclose()
    await asyncio.sleep(WINDOW_SECONDS + 0.1)


async def _fits(page: Page) -> None:
    width = await page.evaluate("() => document.documentElement.scrollWidth")
    viewport = page.viewport_size
    assert viewport is not None
    assert width <= viewport["width"], width


async def _both_widths(
    page: Page, screen: str, report: dict[str, Any], show: Locator | None = None
) -> None:
    """Screenshot and check a screen at 1280 and at 360 px (`show` in view)."""
    was = page.viewport_size
    assert was is not None
    for viewport in (DESKTOP, MOBILE):
        await page.set_viewport_size(viewport)
        await _fits(page)
        if show is not None:
            await show.scroll_into_view_if_needed()
        await screenshot(page, screen)
        await assert_accessible(page, f"{screen}-{viewport['width']}", report)
    await page.set_viewport_size(was)


async def test_a_queued_job_shows_its_place_and_estimate_then_runs(
    bench: Bench,
) -> None:
    """A preset chip goes into the request; the job waits its turn, then runs."""
    other, me = await bench.person(), await bench.person()
    await _finished(other, prompt="a first run, for the estimate")
    await _run_time_known(bench)
    for n in range(2):  # a line ahead of mine
        await _submit(other, prompt=f"ahead of you {n}")
    page, seen = await bench.page_of(me)
    await page.goto(f"{bench.url}/studio#create")
    await expect(page.locator("#balance-value")).to_have_text("100")
    chip = page.locator("#c-presets").get_by_role("button", name="Ink painting")
    await chip.click()
    await expect(chip).to_have_attribute("aria-pressed", "true")
    await expect(page.locator("#c-preset-hint")).to_contain_text("ink wash")
    await page.locator("#c-prompt").fill("a red lantern on a bridge")
    async with page.expect_request(f"{bench.url}/api/generations") as sent:
        await page.locator("#c-prompt").press("Control+Enter")
    body = json.loads((await sent.value).post_data or "{}")
    assert body["preset"] == "guofeng"
    job = page.locator("#jobs > li").first
    await expect(job).to_contain_text("a red lantern on a bridge, traditional Chinese")
    status = job.locator(".job-status")
    await expect(status).to_have_text(
        re.compile(r"^Queued · [1-3] in line · about \d+ s$")
    )
    await _both_widths(page, "queue", bench.axe, show=job)
    await expect(job).to_have_attribute("data-status", "succeeded", timeout=30_000)
    await page.context.close()
    seen.assert_clean()


async def test_try_again_after_a_cancel_and_cancel_all_queued(bench: Bench) -> None:
    """A canceled job tried again is a new job, charged; Cancel all empties the line."""
    other, me = await bench.person(), await bench.person()
    for n in range(6):
        await _submit(other, prompt=f"keeping the worker busy {n}")
    page, seen = await bench.page_of(me, viewport=MOBILE)
    await page.goto(f"{bench.url}/studio#create")
    balance = page.locator("#balance-value")
    await expect(balance).to_have_text("100")
    await page.locator("#c-prompt").fill("a kite over the sea")
    await page.locator("#c-submit").click()
    job = page.locator("#jobs > li", has_text="a kite over the sea").first
    await job.get_by_role("button", name="Cancel job").click()
    await expect(job).to_have_attribute("data-status", "canceled")
    await expect(balance).to_have_text("100")
    await job.get_by_role("button", name="Try again").click()
    jobs = page.locator("#jobs > li", has_text="a kite over the sea")
    await expect(jobs).to_have_count(2)
    await expect(jobs.first).to_have_attribute(
        "data-status", re.compile("queued|running")
    )
    await expect(balance).to_have_text("94")
    await _both_widths(page, "try-again", bench.axe, show=jobs.first)
    await page.locator("#c-prompt").fill("one more for the line")
    await page.locator("#c-submit").click()
    cancel_all = page.get_by_role("button", name="Cancel all queued")
    await expect(cancel_all).to_be_visible()
    await cancel_all.click()
    await expect(page.locator("#toast")).to_contain_text("canceled")
    await expect(page.locator('#jobs > li[data-status="queued"]')).to_have_count(0)
    await expect(balance).to_have_text("100")
    await page.context.close()
    seen.assert_clean()


async def test_search_and_collections_from_the_viewer(bench: Bench) -> None:
    """Search finds 灯笼 in works and jobs; a collection is made, filled and opened."""
    me = await bench.person()
    for prompt in ("一盏红色的灯笼", "a quiet harbour at dawn", "雪中的灯笼"):
        await _finished(me, prompt=prompt)
    page, seen = await bench.page_of(me, locale="zh-CN")
    await page.goto(f"{bench.url}/studio#works")
    tiles = page.locator("#works-grid > li")
    await expect(tiles).to_have_count(3)
    await page.get_by_role("searchbox", name="搜索我的作品和任务").fill("灯笼")
    await page.get_by_role("button", name="搜索", exact=True).click()
    await expect(tiles).to_have_count(2)
    await expect(page.locator("#works-jobs > li")).to_have_count(2)
    await _both_widths(page, "search-zh", bench.axe)
    await page.get_by_role("button", name="清除").click()
    await expect(tiles).to_have_count(3)
    await expect(page.locator("#works-jobs-section")).to_be_hidden()

    await page.get_by_placeholder("新作品集名称").fill("夜晚")
    await page.get_by_role("button", name="新建作品集").click()
    night = page.locator("#collection-list").get_by_role("button", name="夜晚（0）")
    await expect(night).to_be_visible()
    await tiles.first.get_by_role("button").click()
    viewer = page.locator("#viewer")
    await viewer.get_by_role("combobox", name="选择作品集").select_option(label="夜晚")
    await viewer.get_by_role("button", name="加入作品集").click()
    await expect(page.locator("#toast")).to_have_text("已加入“夜晚”。")
    await page.keyboard.press("Escape")
    night = page.locator("#collection-list").get_by_role("button", name="夜晚（1）")
    await night.click()
    await expect(night).to_have_attribute("aria-pressed", "true")
    await expect(tiles).to_have_count(1)
    await expect(tiles.first.locator("img")).to_have_attribute("alt", "雪中的灯笼")
    await _both_widths(page, "collection-zh", bench.axe)
    await page.get_by_role("button", name="重命名").click()
    await page.locator("#collection-newname").fill("夜景")
    await page.locator("#collection-newname").press("Enter")
    await expect(
        page.locator("#collection-list").get_by_role("button", name="夜景（1）")
    ).to_be_visible()
    await page.get_by_role("button", name="删除作品集").click()
    await page.locator("#confirm").get_by_role("button", name="删除").click()
    await expect(page.locator("#collection-list > button")).to_have_count(1)
    await expect(tiles).to_have_count(3)
    await page.context.close()
    seen.assert_clean()


async def test_use_this_prompt_from_the_square_fills_create(bench: Bench) -> None:
    """Model, prompt and size of a published work land in the create form."""
    author = await bench.person()
    done = await _finished(author, prompt="a tall paper crane", size="1024x1536")
    (work,) = done["works"]
    async with author.post(f"/api/works/{work['id']}/publish") as response:
        assert response.status == 200
    page, seen = await bench.page_of(None, viewport=MOBILE)
    await page.goto(f"{bench.url}/studio")
    tile = page.locator(f'#square-grid > li[data-id="{work["id"]}"]')
    await tile.get_by_role("button").click()
    await page.locator("#viewer").get_by_role("button", name="Use this prompt").click()
    await expect(page.locator("#view-create")).to_be_visible()
    await expect(page.locator("#c-model")).to_have_value("seedream-4")
    await expect(page.locator("#c-prompt")).to_have_value("a tall paper crane")
    await expect(page.locator("#c-size")).to_have_value("1024x1536")
    await expect(page.locator("#c-prompt")).to_be_focused()
    await _fits(page)
    # The work's own page links to the same: a new visit lands in Create, filled.
    await page.goto(f"{bench.url}/square/{work['id']}")
    await page.get_by_role("link", name="使用此提示词 · Use this prompt").click()
    await expect(page.locator("#view-create")).to_be_visible()
    await expect(page).to_have_url(f"{bench.url}/studio#create")
    await expect(page.locator("#c-prompt")).to_have_value("a tall paper crane")
    await expect(page.locator("#c-size")).to_have_value("1024x1536")
    await page.context.close()
    seen.assert_clean()


async def test_daily_credits_are_claimed_once_and_count_down(bench: Bench) -> None:
    """The button grants 10 credits; then a countdown to Beijing midnight shows."""
    me = await bench.person()
    for viewport in (DESKTOP, MOBILE):
        page, seen = await bench.page_of(me, viewport=viewport)
        await page.goto(f"{bench.url}/studio#credits")
        daily = page.locator("#credits-body [data-daily]")
        if viewport is DESKTOP:
            await expect(page.locator("#credits-balance")).to_have_text("100")
            await daily.get_by_role("button", name="Claim daily credits").click()
            await expect(page.locator("#balance-value")).to_have_text("110")
        # A second device knows from the ledger that today's were claimed.
        line = daily.locator(".daily-next")
        await expect(line).to_have_text(
            re.compile(r"^Claimed today · next in \d{1,2}:\d\d:\d\d$")
        )
        first = await line.text_content()
        await expect(line).not_to_have_text(first or "", timeout=3000)  # it ticks
        await expect(daily.get_by_role("button")).to_be_hidden()
        await _fits(page)
        await screenshot(page, "daily")
        await assert_accessible(page, f"daily-{viewport['width']}", bench.axe)
        await page.context.close()
        seen.assert_clean()


# Headless Chromium has no background tabs (every page is visible), so the test
# says the tab went to the background the way a browser does (visibilityState
# and its event); the real Notification is still made, and counted on its way.
BACKGROUND = """() => {
    Object.defineProperty(document, 'visibilityState',
        { configurable: true, get: () => 'hidden' });
    document.dispatchEvent(new Event('visibilitychange'));
}"""
COUNT_NOTIFICATIONS = """
window.shown = [];
if ('Notification' in window) {
    const Real = window.Notification;
    window.Notification = class extends Real {
        constructor(title, options) {
            super(title, options);
            window.shown.push([title, options?.body]);
        }
    };
}
"""


async def test_a_job_ending_in_a_background_tab_notifies_if_allowed(
    bench: Bench,
) -> None:
    """Allowed: a notification when the job ends while the tab is hidden; not before."""
    me = await bench.person()
    page, seen = await bench.page_of(me)
    await page.context.grant_permissions(["notifications"], origin=bench.url)
    await page.add_init_script(COUNT_NOTIFICATIONS)
    await page.goto(f"{bench.url}/studio#create")
    await expect(page.locator("#balance-value")).to_have_text("100")
    # Permission already given: nothing to ask for.
    await expect(page.locator("#jobs-notify")).to_be_hidden()
    await page.locator("#c-prompt").fill("seen while I was away")
    await page.locator("#c-submit").click()
    job = page.locator("#jobs > li").first
    await expect(job).to_contain_text("seen while I was away")
    await page.evaluate(BACKGROUND)
    await expect(job).to_have_attribute("data-status", "succeeded", timeout=30_000)
    shown = await page.evaluate("() => window.shown")
    assert shown == [["Your work is ready", "seen while I was away"]]
    await page.context.close()
    seen.assert_clean()


async def test_the_notify_button_asks_only_while_the_browser_has_not_been_told(
    bench: Bench,
) -> None:
    """Not yet asked: the button shows; a visible tab gets no notification."""
    me = await bench.person()
    page, seen = await bench.page_of(me)
    await page.add_init_script(COUNT_NOTIFICATIONS)
    await page.goto(f"{bench.url}/studio#create")
    notify = page.get_by_role("button", name="Notify me when jobs finish")
    await expect(notify).to_be_visible()
    await page.locator("#c-prompt").fill("watched all along")
    await page.locator("#c-submit").click()
    job = page.locator("#jobs > li").first
    await expect(job).to_have_attribute("data-status", "succeeded", timeout=30_000)
    assert await page.evaluate("() => window.shown") == []
    await page.context.close()
    seen.assert_clean()
