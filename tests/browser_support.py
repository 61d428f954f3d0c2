"""Helpers for the browser tests: Chromium, a watch on every page, axe, screenshots."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from playwright.async_api import (
    BrowserContext,
    ConsoleMessage,
    Page,
    Request,
    Response,
    ViewportSize,
    WebError,
    expect,
)

from service.settings import ROOT
from service.store.embedded import MailCatcher

from .conftest import latest_code

# Debian's browser: Playwright's own download cannot reach its CDN from here.
CHROMIUM: Final = Path("/usr/bin/chromium")
CHROMIUM_ARGS: Final = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]
SKIP_REASON: Final = "browser tests need /usr/bin/chromium: apt-get install chromium"
AXE: Final = Path(__file__).parent / "assets" / "axe" / "axe.min.js"
SCREENSHOTS: Final = ROOT / "docs" / "screenshots"
DESKTOP: Final = ViewportSize(width=1280, height=800)
MOBILE: Final = ViewportSize(width=360, height=740)
# axe impacts that fail a test; "moderate" and "minor" are reported, not fatal.
BLOCKING: Final = frozenset({"serious", "critical"})
_FAILED_LOAD: Final = re.compile(r"status of (\d{3})")
FAVICON: Final = "/favicon.ico"


@dataclass
class Watch:
    """Everything that went wrong on a context's pages, minus what a test expects."""

    origin: str
    allowed: set[tuple[int, str]] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)
    urls: list[str] = field(default_factory=list)

    def expect_status(self, status: int, path: str) -> None:
        """Declare an error answer the test provokes on purpose (a wrong code)."""
        self.allowed.add((status, path))

    def _expected(self, status: int, url: str) -> bool:
        path = urlsplit(url).path
        # Chromium asks /favicon.ico by itself for a page naming no icon (the
        # documents, the fake provider's pages), whenever it gets round to it:
        # on a busy machine, while a test still watches.
        return (status, path) in self.allowed or (status, path) == (404, FAVICON)

    def on_console(self, message: ConsoleMessage) -> None:
        if message.type not in ("error", "warning"):
            return
        # Chrome reports a fetch answered with an error status on the console.
        status = _FAILED_LOAD.search(message.text)
        url = message.location.get("url", "")
        if status and self._expected(int(status.group(1)), url):
            return
        self.problems.append(f"console {message.type}: {message.text} ({url})")

    def on_request(self, request: Request) -> None:
        self.urls.append(request.url)

    def on_failed(self, request: Request) -> None:
        failure = request.failure or ""
        # The browser dropping what a page no longer needs (a reload, a closed
        # viewer, a closed stream) is not a failure; an aborted API call would be.
        path = urlsplit(request.url).path
        if "ERR_ABORTED" in failure and (
            not path.startswith("/api/") or path == "/api/events"
        ):
            return
        self.problems.append(f"request failed: {request.url} {failure}")

    def on_response(self, response: Response) -> None:
        if response.status >= 400 and not self._expected(response.status, response.url):
            self.problems.append(f"HTTP {response.status}: {response.url}")
        if not response.url.startswith((self.origin, "data:", "blob:")):
            self.problems.append(f"left the origin: {response.url}")

    def on_error(self, error: WebError) -> None:
        self.problems.append(f"page error: {error.error}")

    def assert_clean(self) -> None:
        """Fail with every problem seen, if any."""
        assert not self.problems, "\n".join(self.problems)


def watch(context: BrowserContext, origin: str) -> Watch:
    """Listen to a context's console, errors, requests and answers."""
    seen = Watch(origin=origin)
    context.on("console", seen.on_console)
    context.on("request", seen.on_request)
    context.on("requestfailed", seen.on_failed)
    context.on("response", seen.on_response)
    context.on("weberror", seen.on_error)
    return seen


async def accessibility_violations(page: Page) -> list[dict[str, Any]]:
    """Run axe-core (injected by the test, never shipped) on what the page shows."""
    if not await page.evaluate("() => typeof window.axe === 'object'"):
        await page.evaluate(AXE.read_text(encoding="utf-8"))
    found: list[dict[str, Any]] = await page.evaluate(
        """async () => {
            const result = await axe.run(document, { resultTypes: ['violations'] });
            return result.violations.map((v) => ({
                id: v.id, impact: v.impact, help: v.help,
                targets: v.nodes.map((n) => n.target.join(' ')).slice(0, 5),
            }));
        }"""
    )
    return found


async def assert_accessible(page: Page, screen: str, report: dict[str, Any]) -> None:
    """No serious or critical axe violation; keep the rest in the report."""
    violations = await accessibility_violations(page)
    report[screen] = violations
    blocking = [v for v in violations if v["impact"] in BLOCKING]
    assert not blocking, f"{screen}: {blocking}"


async def screenshot(page: Page, screen: str) -> Path:
    """Write docs/screenshots/<screen>-<width>.png once images have loaded."""
    # Every image on the screen loaded and decoded (lazy ones below it may wait).
    await page.evaluate(
        """() => Promise.all([...document.images]
            .filter((i) => i.src && i.getBoundingClientRect().top < innerHeight
                && i.getClientRects().length)
            .map((i) => i.decode().catch(() => null)))"""
    )
    viewport = page.viewport_size
    assert viewport is not None
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{screen}-{viewport['width']}.png"
    await page.screenshot(path=path, animations="disabled", caret="hide")
    return path


async def request_code(page: Page, email: str) -> None:
    """Open the sign-in dialog (if needed) and ask for a code."""
    dialog = page.locator("#signin")
    if not await dialog.is_visible():
        await page.locator("#signin-button").click()
    await expect(dialog).to_be_visible()
    await page.locator("#s-email").fill(email)
    await page.locator("#s-email").press("Enter")


async def sign_in(page: Page, mail_server: MailCatcher, email: str) -> None:
    """Sign in through the dialog with the code the SMTP server received."""
    await request_code(page, email)
    code = page.locator("#s-code")
    await expect(code).to_be_visible()
    digits = latest_code(mail_server, email)
    # Typed as the mail shows it: "1234 5678".
    await code.fill(f"{digits[:4]} {digits[4:]}")
    await code.press("Enter")
    await expect(page.locator("#signout-button")).to_be_visible()
