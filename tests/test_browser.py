"""The workbench in a real browser: headless Chromium on the real app, servers, worker.

One app on a real TCP port, one worker process on the demo upstream and one
browser serve the whole module (its tests share an event loop for that); each
test opens its own browser contexts, so cookies and storage never leak between
them. Every page is watched: a console error, a failed request or an error
answer the test did not provoke fails it.
"""

from __future__ import annotations

import asyncio
import base64
import io
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer
from PIL import Image
from playwright.async_api import (
    Browser,
    Page,
    ViewportSize,
    async_playwright,
    expect,
)
from redis.asyncio import Redis

from service.app import create_app
from service.keys import SETTINGS
from service.labels.explicit import stamp_for
from service.settings import load_settings
from service.store.embedded import MailCatcher, RedisServer

from .browser_support import (
    CHROMIUM,
    CHROMIUM_ARGS,
    DESKTOP,
    MOBILE,
    SCREENSHOTS,
    SKIP_REASON,
    Watch,
    assert_accessible,
    request_code,
    screenshot,
    sign_in,
    watch,
)
from .conftest import GENEROUS_LIMITS, TEST_SECRET, latest_code
from .ports import free_port
from .processes import studio_environ
from .workbench import (
    new_address,
    sign_in as sign_in_api,
    studio_command,
    wait_for_status,
    worker_process,
)

if not CHROMIUM.exists():
    pytest.skip(SKIP_REASON, allow_module_level=True)

pytestmark = pytest.mark.asyncio(loop_scope="module")

Client = TestClient[web.Request, web.Application]
# Published by the fixture: one more than the square's first page (24), and a video.
IMAGE_GENERATIONS = 6
PAGE_WEIGHT_LIMIT = 100 * 1024


@dataclass
class Live:
    """The running service, as a browser and an operator see it."""

    url: str
    browser: Browser
    client: Client
    mail: MailCatcher
    operator: dict[str, str]
    axe: dict[str, Any] = field(default_factory=dict)

    async def context_page(
        self, viewport: ViewportSize = DESKTOP, locale: str = "en-US"
    ) -> tuple[Page, Watch]:
        """Open a fresh context (no cookie, no storage) and a watched page in it."""
        context = await self.browser.new_context(viewport=viewport, locale=locale)
        seen = watch(context, self.url)
        page = await context.new_page()
        return page, seen

    async def grant(self, email: str, credits: int) -> None:
        """Give credits as an operator does: `studio credits grant`."""
        done = await studio_command(
            "credits", "grant", email, str(credits), environ=self.operator
        )
        assert done.returncode == 0, done.stderr


@dataclass
class Published:
    """What the fixture put in the square, and whose it is."""

    email: str
    works: list[dict[str, Any]]
    video: dict[str, Any]
    top: dict[str, Any]
    cookies: dict[str, str]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def live(
    redis_server: RedisServer,
    mail_server: MailCatcher,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Live]:
    """Serve the real app on a free port, with a worker and a browser."""
    redis = Redis.from_url(redis_server.url)
    await redis.flushdb()
    await redis.aclose()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    shared = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "1",
        # These tests are about what people see, not about speed: a square read
        # on a crowded machine may take longer than production's 0.1 s without
        # the page falling back to an older copy.
        "STUDIO_SQUARE_READ_BUDGET": "1",
        "STUDIO_MEDIA_DIR": str(tmp_path_factory.mktemp("browser") / "media"),
    }
    settings = load_settings(
        {
            **shared,
            **GENEROUS_LIMITS,
            "STUDIO_BASE_URL": url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail_server.host,
            "STUDIO_SMTP_PORT": str(mail_server.port),
            "STUDIO_JOBS_PER_USER": "8",
        }
    )
    client: Client = TestClient(TestServer(create_app(settings), port=port))
    await client.start_server()
    operator = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    try:
        with worker_process(shared):
            async with async_playwright() as playwright:
                browser = await playwright.chromium.launch(
                    executable_path=str(CHROMIUM), args=CHROMIUM_ARGS
                )
                yield Live(url, browser, client, mail_server, operator)
                await browser.close()
    finally:
        await client.close()


class Tags(HTMLParser):
    """Every start tag of a page with its attributes, to check what it may run."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.found.append((tag, {k: v or "" for k, v in attrs}))

    @classmethod
    def of(cls, page: str) -> list[tuple[str, dict[str, str]]]:
        """Parse a page and list its tags."""
        parser = cls()
        parser.feed(page)
        return parser.found


# Drop a file on the create form the way a person dragging one from a desktop does.
DROP_FILE = """(b64) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], 'sketch.png', { type: 'image/png' }));
    const form = document.getElementById('create-form');
    for (const type of ['dragover', 'drop']) {
        form.dispatchEvent(new DragEvent(type,
            { dataTransfer: data, bubbles: true, cancelable: true }));
    }
}"""


def _png(width: int, height: int) -> str:
    """Return a small real PNG, base64-encoded."""
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 90, 40)).save(out, "PNG")
    return base64.b64encode(out.getvalue()).decode()


async def square_size(live: Live, kind: str = "") -> int:
    """Count what the square holds now (other tests publish too)."""
    query = f"&kind={kind}" if kind else ""
    response = await live.client.get(f"/api/square?limit=50{query}")
    body = await response.json()
    assert body["next_cursor"] is None
    return len(body["items"])


async def _submit(client: Client, **body: Any) -> str:
    response = await client.post("/api/generations", json=body)
    assert response.status == 202, await response.text()
    gid: str = (await response.json())["id"]
    return gid


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def published(live: Live) -> Published:
    """Fill the square through the real API: 24 images and a video, one favorited."""
    client = live.client
    user = await sign_in_api(client, live.mail)
    await live.grant(user["email"], 1000)
    # The newest pictures are wide (3:2): shown whole, their mark is in view.
    gids = [
        await _submit(
            client,
            model="seedream-4",
            prompt=f"a glass lighthouse, study {n}",
            count=4,
            seed=n,
            size="1536x1024" if n == IMAGE_GENERATIONS - 1 else "1024x1024",
        )
        for n in range(IMAGE_GENERATIONS)
    ]
    gids.append(
        await _submit(
            client, model="kling-2-1", prompt="waves on black sand", size="1280x720"
        )
    )
    done = await asyncio.gather(
        *(wait_for_status(client, gid, {"succeeded"}, 60) for gid in gids)
    )
    works = [work for generation in done for work in generation["works"]]
    for work in works:
        response = await client.post(f"/api/works/{work['id']}/publish")
        assert response.status == 200, await response.text()
    # The oldest publication gets the one favorite, so `top` puts it first.
    top = works[0]
    assert (await client.put(f"/api/works/{top['id']}/favorite")).status == 204
    video = next(w for w in works if w["kind"] == "video")
    cookies = {c.key: c.value for c in client.session.cookie_jar}
    return Published(user["email"], works, video, top, cookies)


async def test_the_page_and_its_files_are_served_with_a_strict_policy(
    live: Live,
) -> None:
    """No inline script or style, nosniff, our types, immutable hashed file URLs."""
    async with ClientSession() as session:
        async with session.get(f"{live.url}/studio") as response:
            assert response.status == 200
            headers = response.headers
            page = await response.text()
        policy = headers["Content-Security-Policy"]
        directives = dict(part.partition(" ")[::2] for part in policy.split("; "))
        assert directives["script-src"] == "'self'"
        assert directives["style-src"] == "'self'"
        assert directives["connect-src"] == "'self'"
        assert directives["default-src"] == "'none'"
        assert "unsafe" not in policy
        assert headers["X-Content-Type-Options"] == "nosniff"
        assert headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Cache-Control"] == "no-cache"
        assert headers["Content-Encoding"] == "gzip"
        etag = headers["ETag"]
        async with session.get(
            f"{live.url}/studio", headers={"If-None-Match": etag}
        ) as again:
            assert again.status == 304

        tags = Tags.of(page)
        assert not [tag for tag, attrs in tags if tag == "style" or "style" in attrs]
        assert not [a for _, attrs in tags for a in attrs if a.startswith("on")]
        scripts = [attrs for tag, attrs in tags if tag == "script"]
        assert all(a.get("src") or a.get("type") == "application/json" for a in scripts)
        files = [a["src"] for a in scripts if a.get("src")] + [
            a["href"]
            for tag, a in tags
            if tag == "link" and a.get("rel") in ("stylesheet", "modulepreload", "icon")
        ]
        assert len(files) >= 5
        types = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
        for path in files:
            assert re.fullmatch(
                r"/static/studio/[0-9a-f]{16}/[a-z0-9]+\.(js|css|svg)", path
            )
            async with session.get(live.url + path) as file:
                assert file.status == 200, path
                kind = file.headers["Content-Type"].split(";")[0]
                assert kind == types[Path(path).suffix]
                assert file.headers["X-Content-Type-Options"] == "nosniff"
                assert "immutable" in file.headers["Cache-Control"]
            async with session.head(live.url + path) as head:
                assert head.status == 200
        stale = re.sub(r"/[0-9a-f]{16}/", "/0000000000000000/", files[0])
        async with session.get(live.url + stale) as missing:
            assert missing.status == 404
            assert missing.headers["X-Content-Type-Options"] == "nosniff"


async def test_the_first_load_weighs_under_100_kb_compressed(live: Live) -> None:
    """HTML, CSS and JavaScript of a first visit, as sent over the wire."""
    page, seen = await live.context_page()
    weighed: list[tuple[str, int]] = []

    async def weigh(response: Any) -> None:
        request = response.request
        if request.resource_type in ("document", "stylesheet", "script"):
            sizes = await request.sizes()
            weighed.append((response.url, sizes["responseBodySize"]))

    tasks: list[asyncio.Task[None]] = []
    page.on("response", lambda r: tasks.append(asyncio.ensure_future(weigh(r))))
    await page.goto(f"{live.url}/studio", wait_until="networkidle")
    await asyncio.gather(*tasks)
    assert any(url.endswith("/studio") for url, _ in weighed)
    assert sum(1 for url, _ in weighed if url.endswith(".js")) >= 5
    total = sum(size for _, size in weighed)
    assert 0 < total < PAGE_WEIGHT_LIMIT, weighed
    await page.context.close()
    seen.assert_clean()


async def test_a_visitor_browses_the_square_and_is_asked_to_sign_in_to_favorite(
    live: Live, published: Published
) -> None:
    """Thumbnails, more on scroll, filters, the viewer and its keys, then a sign-in."""
    page, seen = await live.context_page()
    await page.goto(f"{live.url}/studio")
    tiles = page.locator("#square-grid > li")
    # A desktop screen shows the end of the first page: the next one follows.
    await expect(tiles).to_have_count(await square_size(live))
    thumbs = {w["thumb_url"] for w in published.works}
    shown = await page.locator("#square-grid img").evaluate_all(
        "(imgs) => imgs.map((i) => i.getAttribute('src'))"
    )
    assert set(shown) <= thumbs, "grids show thumbnails, never originals"
    await screenshot(page, "square")
    await assert_accessible(page, "square", live.axe)
    # A visitor's page never asks who they are: no 401 to hide.
    assert not [u for u in seen.urls if u.endswith("/api/me")]

    await page.get_by_role("radio", name="Videos").check()
    await expect(tiles).to_have_count(await square_size(live, "video"))
    await tiles.last.get_by_role("button").click()
    viewer = page.locator("#viewer")
    await expect(viewer).to_be_visible()
    video = viewer.locator("video")
    await expect(video).to_have_attribute("src", published.video["media_url"])
    assert await video.get_attribute("controls") is not None
    await expect(viewer).to_contain_text("Kling 2.1")
    await page.keyboard.press("Escape")
    await expect(viewer).to_be_hidden()

    await page.get_by_role("radio", name="All").check()
    await page.get_by_role("radio", name="Most favorited").check()
    await expect(tiles.first).to_have_attribute("data-id", published.top["id"])
    await tiles.first.get_by_role("button").click()
    image = viewer.locator("#v-media > :not(.ai-badge)")
    await expect(image).to_have_attribute("src", published.top["media_url"])
    await expect(viewer).to_contain_text(published.top["prompt"])
    await expect(viewer).to_contain_text("Seedream 4.0")
    await page.keyboard.press("ArrowRight")
    await expect(image).not_to_have_attribute("src", published.top["media_url"])
    await page.keyboard.press("ArrowLeft")
    await expect(image).to_have_attribute("src", published.top["media_url"])
    await screenshot(page, "viewer")
    await assert_accessible(page, "viewer", live.axe)

    await viewer.get_by_role("button", name="Favorite").click()
    dialog = page.locator("#signin")
    await expect(dialog).to_be_visible()
    await expect(dialog).to_contain_text("This needs you to sign in first.")
    await expect(dialog).to_contain_text("100 trial credits")
    await screenshot(page, "signin")
    await assert_accessible(page, "signin", live.axe)
    await page.context.close()
    seen.assert_clean()


async def test_a_person_creates_watches_cancels_publishes_and_a_visitor_favorites(
    live: Live, published: Published
) -> None:
    """Sign in, make an image and a video live, cancel, publish, favorite, sign out."""
    page, seen = await live.context_page()
    await page.goto(f"{live.url}/studio#create")
    email = new_address()
    await page.locator("#c-submit").click()  # "Sign in to create"
    await sign_in(page, live.mail, email)
    greeting = page.locator("#s-welcome-text")
    await expect(greeting).to_have_text(
        "Welcome! Your new account has 100 trial credits."
    )
    await page.get_by_role("button", name="Get started").click()
    balance = page.locator("#balance-value")
    await expect(balance).to_have_text("100")

    # An image: price before submitting, Ctrl+Enter, live progress, results in place.
    await page.locator("#c-model").select_option("seedream-4")
    await page.locator("#c-prompt").fill("a paper lantern over a river at dusk")
    await page.locator("#c-count").fill("2")
    await page.get_by_text("More options").click()
    await page.locator("#c-seed").fill("42")
    await expect(page.locator("#c-price")).to_have_text(
        "This costs 12 credits (6 × 2) · Balance 100"
    )
    # A reference image dropped on the form: shown at once, uploaded at once.
    await page.evaluate(DROP_FILE, _png(64, 48))
    await expect(page.locator("#c-ref-status")).to_have_text("Uploaded, 64×48")
    await expect(page.locator("#c-ref-img")).to_have_attribute(
        "src", re.compile(r"^blob:")
    )
    await page.evaluate(
        """() => { window.seen = [];
            new MutationObserver(() => {
                for (const s of document.querySelectorAll('.job .job-status'))
                    window.seen.push(s.textContent);
            }).observe(document.getElementById('jobs'),
                { subtree: true, childList: true, characterData: true }); }"""
    )
    await page.locator("#c-prompt").press("Control+Enter")
    job = page.locator("#jobs > li").first
    await expect(job).to_contain_text("a paper lantern over a river at dusk")
    await expect(job).to_have_attribute("data-status", "succeeded", timeout=20_000)
    await expect(job.locator(".tile")).to_have_count(2)
    await expect(balance).to_have_text("88")
    statuses: list[str] = await page.evaluate("() => window.seen")
    working = [
        int(m.group(1)) for s in statuses if (m := re.match(r"Working (\d+)%", s))
    ]
    assert any(0 < p < 100 for p in working), statuses
    await screenshot(page, "create")
    await assert_accessible(page, "create", live.axe)

    # A video costs more than is left: the button says why, until an operator grants.
    await page.locator("#c-model").select_option("kling-2-1")
    submit = page.locator("#c-submit")
    await expect(submit).to_be_disabled()
    await expect(page.locator("#c-reason")).to_have_text(
        "Not enough credits: 120 needed, 88 left."
    )
    await live.grant(email, 300)
    await expect(balance).to_have_text("388")  # the event stream said so
    await expect(submit).to_be_enabled()
    await page.locator("#c-prompt").fill("a slow pan over a harbour at night")
    await page.locator("#c-prompt").press("Control+Enter")
    video_job = page.locator("#jobs > li").first
    await expect(video_job).to_contain_text("a slow pan over a harbour at night")
    await expect(video_job).to_have_attribute(
        "data-status", "succeeded", timeout=30_000
    )
    await expect(video_job.locator(".badge")).to_have_text("Video · 5 s")
    await expect(balance).to_have_text("268")

    # A job canceled at once says so, and that its credits came back.
    await page.locator("#c-model").select_option("hailuo-02")
    await page.locator("#c-prompt").fill("this one is canceled")
    await submit.click()
    canceled = page.locator("#jobs > li").first
    await expect(canceled).to_contain_text("this one is canceled")
    await canceled.get_by_role("button", name="Cancel job").click()
    await expect(canceled).to_have_attribute("data-status", "canceled")
    await expect(canceled).to_contain_text("100 credits returned")
    await expect(balance).to_have_text("268")

    # My works: publish the video, run an image again, delete the other image.
    await page.get_by_role("link", name="My works").click()
    tiles = page.locator("#works-grid > li")
    await expect(tiles).to_have_count(3)
    await screenshot(page, "works")
    await assert_accessible(page, "works", live.axe)
    await tiles.first.get_by_role("button").click()
    viewer = page.locator("#viewer")
    await expect(viewer.locator("video")).to_be_visible()
    download = viewer.get_by_role("link", name="Download")
    assert (await download.get_attribute("download") or "").endswith(".mp4")
    await viewer.get_by_role("button", name="Publish to the square").click()
    await expect(viewer.get_by_role("button", name="Unpublish")).to_be_visible()
    await expect(viewer.get_by_role("link", name="Work page")).to_be_visible()
    video_src = await viewer.locator("video").get_attribute("src")
    await page.keyboard.press("ArrowRight")
    await expect(viewer.locator("img")).to_be_visible()
    await viewer.get_by_role("button", name="Delete").click()
    confirm = page.locator("#confirm")
    await expect(confirm).to_be_visible()
    await assert_accessible(page, "confirm", live.axe)
    await confirm.get_by_role("button", name="Delete").click()
    await expect(tiles).to_have_count(2)
    await expect(viewer.locator("img")).to_be_visible()  # the next one
    await viewer.get_by_role("button", name="Run again, same seed").click()
    await expect(page.locator("#view-create")).to_be_visible()
    await expect(page.locator("#c-model")).to_have_value("seedream-4")
    await expect(page.locator("#c-prompt")).to_have_value(
        "a paper lantern over a river at dusk"
    )
    await expect(page.locator("#c-seed")).to_have_value("42")
    await expect(page.locator("#c-count")).to_have_value("2")
    await expect(page.locator("#c-ref-status")).to_have_text(
        "Uses the original's reference image"
    )
    # The work deleted in the viewer is gone from its job in Create too.
    lantern = page.locator("#jobs > li", has_text="a paper lantern over a river")
    await expect(lantern.locator(".tile")).to_have_count(1)

    # Credits: the balance, its lots and every entry, refunds included.
    await page.get_by_role("link", name="Credits", exact=True).click()
    await expect(page.locator("#credits-balance")).to_have_text("268")
    # The trial lot was spent first (soonest to expire); the operator's bonus is left.
    await expect(page.locator("#lots tr")).to_have_count(1)
    await expect(page.locator("#lots tr")).to_contain_text("Bonus")
    entries = page.locator("#entries tr")
    await expect(entries).to_have_count(6)
    await expect(entries.first).to_contain_text("Returned")
    await screenshot(page, "credits")
    await assert_accessible(page, "credits", live.axe)

    # Someone else, in Chinese and with no session, finds it in the square.
    other, other_seen = await live.context_page(locale="zh-CN")
    await other.goto(f"{live.url}/studio")
    first = other.locator("#square-grid > li").first
    await expect(first.locator("img")).to_have_attribute(
        "alt", "a slow pan over a harbour at night"
    )
    await first.get_by_role("button").click()
    other_viewer = other.locator("#viewer")
    await expect(other_viewer.locator("video")).to_have_attribute(
        "src", video_src or ""
    )
    await other_viewer.get_by_role("button", name="收藏").click()
    await sign_in(other, live.mail, new_address())
    await expect(other.locator("#s-welcome-text")).to_have_text(
        "欢迎！已为你的新账户送上 100 积分。"
    )
    await other.get_by_role("button", name="开始使用").click()
    favorite = other_viewer.get_by_role("button", name="收藏")
    await expect(favorite).to_have_attribute("aria-pressed", "true")
    await expect(other_viewer.locator("dd").nth(4)).to_have_text("1")
    await other.keyboard.press("Escape")
    await other.get_by_role("link", name="收藏").click()
    await expect(other.locator("#favorites-grid > li")).to_have_count(1)
    await screenshot(other, "favorites-zh")
    await assert_accessible(other, "favorites-zh", live.axe)

    # Signing out ends the session here; the other browser is not touched.
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.locator("#signin-button")).to_be_visible()
    await expect(page.locator("#balance")).to_be_hidden()
    await page.get_by_role("link", name="My works").click()
    await expect(page.locator("#signin")).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(page.locator("#works-status")).to_have_text("Sign in to see this.")
    await expect(page.locator("#works-grid > li")).to_have_count(0)
    await page.context.close()
    await other.context.close()
    seen.assert_clean()
    other_seen.assert_clean()


async def test_a_wrong_code_and_too_many_requests_are_said_in_words(
    live: Live,
) -> None:
    """INVALID_EMAIL, INVALID_CODE, CODE_EXPIRED_REQUEST_NEW and RATE_LIMITED."""
    page, seen = await live.context_page()
    seen.expect_status(400, "/api/auth/code")
    seen.expect_status(400, "/api/auth/verify")
    await page.goto(f"{live.url}/studio")
    error = page.locator("#s-error")
    await request_code(page, "someone@nowhere")
    await expect(error).to_have_text(
        "That e-mail address is not valid. Please check it."
    )

    email = new_address()
    await request_code(page, email)
    code = page.locator("#s-code")
    await expect(page.locator("#s-sent")).to_have_text(
        f"We sent a code to {email}. It is valid for 10 minutes."
    )
    resend = page.locator("#s-resend")
    await expect(resend).to_be_disabled()
    await expect(resend).to_have_text(re.compile(r"Resend in (60|59|58) s"))
    right = latest_code(live.mail, email)
    wrong = f"{(int(right) + 1) % 10**8:08d}"
    await code.fill(f"{wrong[:4]}-{wrong[4:]}")
    await expect(code).to_have_value(f"{wrong[:4]} {wrong[4:]}")
    await code.press("Enter")
    await expect(error).to_have_text(
        "That code is wrong or has expired. Please check it."
    )
    await assert_accessible(page, "signin-error", live.axe)
    for _ in range(4):
        async with page.expect_response(f"{live.url}/api/auth/verify"):
            await code.press("Enter")
    await expect(error).to_have_text(
        "Too many tries: this code no longer works. Ask for a new one."
    )

    # The same address from another browser, within its minute: told how long to wait.
    again, again_seen = await live.context_page(locale="zh-CN")
    again_seen.expect_status(429, "/api/auth/code")
    await again.goto(f"{live.url}/studio")
    await request_code(again, email)
    await expect(again.locator("#s-error")).to_have_text(
        re.compile(r"请求太频繁，请 ([1-9]|[1-5]\d|60) 秒后再试。")
    )
    await page.context.close()
    await again.context.close()
    seen.assert_clean()
    again_seen.assert_clean()


async def _assert_marks_uncovered(page: Page, published: Published) -> None:
    """The AI生成 plate burnt into each published picture's bottom-right corner is
    in view on its tile in My works, and nothing we draw over the tile covers it."""
    sizes = {w["id"]: (w["width"], w["height"]) for w in published.works}
    tiles = page.locator("#works-grid > li:has(.flag):not(:has(.tile.video))")
    assert await tiles.count() > 0
    shapes = set()
    for index in range(await tiles.count()):
        tile = tiles.nth(index)
        width, height = sizes[await tile.get_attribute("data-id") or ""]
        shapes.add(width == height)
        shown = await tile.locator("img").bounding_box()
        assert shown is not None
        # Where the picture is drawn in its box, as its object-fit places it.
        fit = await tile.locator("img").evaluate("i => getComputedStyle(i).objectFit")
        scales = (shown["width"] / width, shown["height"] / height)
        scale = max(scales) if fit == "cover" else min(scales)
        x0 = shown["x"] + (shown["width"] - width * scale) / 2
        y0 = shown["y"] + (shown["height"] - height * scale) / 2
        left, top, right, bottom = stamp_for(width, height).box
        plate = (
            x0 + left * scale,
            y0 + top * scale,
            x0 + right * scale,
            y0 + bottom * scale,
        )
        assert shown["x"] <= plate[0], "the mark is cropped off"
        assert plate[2] <= shown["x"] + shown["width"], "the mark is cropped off"
        assert shown["y"] <= plate[1], "the mark is cropped off"
        assert plate[3] <= shown["y"] + shown["height"], "the mark is cropped off"
        overlays = tile.locator(".ai-badge, .badge, .flag")
        assert await overlays.count() >= 2
        for n in range(await overlays.count()):
            box = await overlays.nth(n).bounding_box()
            assert box is not None
            apart = (
                box["x"] + box["width"] <= plate[0]
                or box["x"] >= plate[2]
                or box["y"] + box["height"] <= plate[1]
                or box["y"] >= plate[3]
            )
            assert apart, f"{await overlays.nth(n).inner_text()} covers the mark"
    assert shapes == {True, False}  # square and wide pictures were both checked


async def test_the_workbench_fits_a_360_px_wide_phone(
    live: Live, published: Published
) -> None:
    """Every screen fits 360 px without sideways scrolling; more loads on scroll."""
    page, seen = await live.context_page(viewport=MOBILE)
    await page.goto(f"{live.url}/studio")
    tiles = page.locator("#square-grid > li")
    await expect(tiles).to_have_count(24)
    await page.locator("#square-more").scroll_into_view_if_needed()
    await expect(tiles).to_have_count(await square_size(live))
    await page.evaluate("() => window.scrollTo(0, 0)")

    async def fits(screen: str) -> None:
        width = await page.evaluate("() => document.documentElement.scrollWidth")
        assert width <= MOBILE["width"], f"{screen} is {width} px wide"
        await screenshot(page, screen)
        await assert_accessible(page, f"{screen}-mobile", live.axe)

    await fits("square")
    await tiles.first.get_by_role("button").click()
    await expect(page.locator("#viewer")).to_be_visible()
    await fits("viewer")
    await page.keyboard.press("Escape")
    await page.locator("#signin-button").click()
    await fits("signin")
    await page.keyboard.press("Escape")

    # The person who filled the square, already signed in (their session cookie).
    await page.context.add_cookies(
        [
            {"name": name, "value": value, "url": live.url, "httpOnly": True}
            for name, value in published.cookies.items()
        ]
    )
    await page.evaluate("() => localStorage.setItem('studio.session', '1')")
    await page.goto(f"{live.url}/studio#create")  # a fragment: no new load yet
    await page.reload()
    await expect(page.locator("#balance-value")).not_to_be_empty()
    await expect(page.locator("#jobs > li")).to_have_count(7)
    await fits("create")
    await page.get_by_role("link", name="My works").click()
    await expect(page.locator("#works-grid > li").first).to_be_visible()
    await fits("works")
    await _assert_marks_uncovered(page, published)
    await page.get_by_role("link", name="Credits", exact=True).click()
    await expect(page.locator("#entries tr").first).to_be_visible()
    await fits("credits")
    # A work's own page: its image shrinks to the screen.
    await page.goto(f"{live.url}/square/{published.works[0]['id']}")
    await expect(page.locator("article.work img")).to_be_visible()
    await fits("square-page")
    await page.context.close()
    seen.assert_clean()


async def test_the_language_follows_the_browser_and_the_switch_is_remembered(
    live: Live,
) -> None:
    """zh-CN browsers get Chinese, others English; a choice survives a reload."""
    page, seen = await live.context_page(locale="zh-CN")
    await page.goto(f"{live.url}/studio")
    root = page.locator("html")
    await expect(root).to_have_attribute("lang", "zh-Hans")
    await expect(page.get_by_role("link", name="广场")).to_be_visible()
    # The switch asks for the presets in English; a reload while that call is in
    # flight would abort it, which the watch counts as a failed API call.
    async with page.expect_response(
        lambda response: "/api/presets?lang=en" in response.url
    ) as presets:
        await page.get_by_label("语言").select_option("en")
    await (await presets.value).finished()
    await expect(root).to_have_attribute("lang", "en")
    await expect(page.get_by_role("link", name="Square")).to_be_visible()
    await expect(page).to_have_title("Workbench · Liuguang Studio")
    await page.reload()
    await expect(root).to_have_attribute("lang", "en")
    await expect(page.get_by_label("Language")).to_have_value("en")
    await page.context.close()

    english, english_seen = await live.context_page(locale="en-GB")
    await english.goto(f"{live.url}/studio")
    await expect(english.locator("html")).to_have_attribute("lang", "en")
    await english.context.close()
    seen.assert_clean()
    english_seen.assert_clean()


async def test_keyboard_focus_is_visible_and_motion_can_be_turned_down(
    live: Live,
) -> None:
    """Tab reaches a skip link with an outline; reduced motion stops transitions."""
    page, seen = await live.context_page()
    await page.emulate_media(reduced_motion="reduce")
    await page.goto(f"{live.url}/studio")
    await page.keyboard.press("Tab")
    skip = page.get_by_role("link", name="Skip to content")
    await expect(skip).to_be_focused()
    box = await skip.bounding_box()
    assert box is not None
    assert box["y"] >= 0
    outline = await skip.evaluate(
        "(el) => [getComputedStyle(el).outlineStyle, getComputedStyle(el).outlineWidth]"
    )
    assert outline == ["solid", "3px"]
    await page.keyboard.press("Tab")
    await page.keyboard.press("Tab")
    await expect(page.get_by_role("button", name="Sign in")).to_be_focused()
    toast = page.locator("#toast")
    assert await toast.evaluate("(el) => getComputedStyle(el).transitionDuration") in (
        "0s",
        "0s, 0s",
    )
    await page.context.close()
    seen.assert_clean()


async def test_a_person_signs_in_through_a_proof_of_work_when_mail_runs_low(
    live: Live, redis_server: RedisServer
) -> None:
    """The page meets 429 CHALLENGE_REQUIRED by solving it and sending again."""
    app = live.client.app
    assert app is not None
    free = app[SETTINGS].limits["mail-free"]
    key = "studio:rl:v1:{all}:mail-free"
    redis = Redis.from_url(redis_server.url)
    seconds, micros = await redis.time()
    full = free.burst * free.interval_us  # the free part of the budget spent
    await redis.set(key, seconds * 1_000_000 + micros + full, px=full // 1000)
    try:
        page, seen = await live.context_page()
        seen.expect_status(429, "/api/auth/code")
        answers: list[int] = []
        sent: list[dict[str, Any]] = []

        def on_response(response: Any) -> None:
            if response.url.endswith("/api/auth/code"):
                answers.append(response.status)
                sent.append(response.request.post_data_json)

        page.on("response", on_response)
        await page.goto(f"{live.url}/studio")
        await sign_in(page, live.mail, new_address())
        assert answers == [429, 200]
        assert "altcha" not in sent[0]
        assert "altcha" in sent[1]
        await page.context.close()
        seen.assert_clean()
    finally:
        await redis.delete(key)
        await redis.aclose()


async def test_every_work_and_player_shows_the_ai_badge(
    live: Live, published: Published
) -> None:
    """The square's tiles, the viewer (picture and video player) and the work page
    say AI-generated beside every work; the stored picture shows AI生成 itself."""
    for viewport in (DESKTOP, MOBILE):
        page, seen = await live.context_page(viewport)
        await page.goto(f"{live.url}/studio")
        tiles = page.locator("#square-grid > li")
        await expect(tiles.first).to_be_visible()
        badges = page.locator("#square-grid .ai-badge")
        unbadged = page.locator("#square-grid > li:not(:has(.ai-badge))")
        await expect(unbadged).to_have_count(0)
        await expect(badges.first).to_have_text("AI-generated")
        await expect(badges.first).to_be_visible()
        await screenshot(page, "square-badge")
        viewer = page.locator("#viewer")
        await page.get_by_role("radio", name="Videos").check()
        # A clip's poster whole, so the AI生成 burnt into its corner shows too.
        poster = page.locator("#square-grid .tile.video img").last
        await expect(poster).to_have_css("object-fit", "contain")
        await screenshot(page, "square-videos")
        await tiles.last.get_by_role("button").click()
        await expect(viewer.locator("video")).to_be_visible()
        await expect(viewer.locator("#v-media .ai-badge")).to_be_visible()
        await screenshot(page, "player-badge")
        await page.keyboard.press("Escape")
        await page.get_by_role("radio", name="Images").check()
        await expect(page.locator("#square-grid .tile .badge")).to_have_count(0)
        await expect(tiles.first).to_be_visible()
        work_id = await tiles.first.get_attribute("data-id")
        await tiles.first.get_by_role("button").click()
        await expect(viewer.locator("#v-media > img")).to_be_visible()
        await expect(viewer.locator("#v-media .ai-badge")).to_have_text("AI-generated")
        await screenshot(page, "viewer-badge")
        await assert_accessible(page, "viewer-badge", live.axe)
        seen.expect_status(404, "/favicon.ico")  # the public pages name no icon
        await page.goto(f"{live.url}/square/{work_id}")
        work_badge = page.locator(".work-media .ai-badge")
        await expect(work_badge).to_have_text("AI生成 · AI-generated")
        await expect(page.locator("main")).to_contain_text(
            "“AI生成” in the bottom-right"
        )
        await screenshot(page, "work-badge")
        await page.context.close()
        seen.assert_clean()
    page, seen = await live.context_page(locale="zh-CN")
    await page.goto(f"{live.url}/studio")
    await expect(page.locator("#square-grid .ai-badge").first).to_have_text("AI生成")
    await page.context.close()
    seen.assert_clean()
    media = await live.client.get(published.top["media_url"])
    (SCREENSHOTS / "labeled-image.png").write_bytes(await media.read())
