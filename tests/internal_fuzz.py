"""The real app served on a port of its own, for fuzzers that speak plain HTTP.

Schemathesis and hypothesis call synchronously (`requests`), so the app runs
on its own event loop in a thread, built by `create_app(settings)` and served
with the handler options `serve` uses. Every log record the service writes at
WARNING or above is kept, so a test can say which request made a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
from aiohttp import web

from service.app import create_app
from service.settings import Settings
from service.store.embedded import MailCatcher
from service.web.hardening import handler_options, setup_log_hygiene

from .conftest import latest_code

# What a started or stopped app may take at most, in seconds.
_START_SECONDS: Final = 30.0
# Log lines that say a request broke something, whatever their level.
_BROKEN: Final = ("Traceback", "store unavailable")


class LogWatch(logging.Handler):
    """Keep every record at WARNING or above; hand over the ones that show a fault."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self._records: list[logging.LogRecord] = []
        self._lock_records = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        """Keep the record (called from the app's thread)."""
        with self._lock_records:
            self._records.append(record)

    def faults(self) -> list[str]:
        """Return, and forget, the records that show a fault: tracebacks, errors."""
        with self._lock_records:
            records, self._records = self._records, []
        return [
            self.format(record)
            for record in records
            if record.exc_info
            or record.levelno >= logging.ERROR
            or any(mark in record.getMessage() for mark in _BROKEN)
        ]


@dataclass
class Served:
    """The app on its port, its log, and how to reach it as a browser would."""

    app: web.Application
    base_url: str
    log: LogWatch
    mail: MailCatcher
    anonymous: requests.Session = field(default_factory=requests.Session)
    signed_in: requests.Session = field(default_factory=requests.Session)

    def same_origin(self) -> dict[str, str]:
        """The headers a browser sends on a state change from our own pages."""
        return {"Sec-Fetch-Site": "same-origin", "Origin": self.base_url}

    def sign_in(self) -> requests.Session:
        """Sign a new address in through the real e-mail code flow."""
        session = requests.Session()
        email = f"fuzz-{uuid.uuid4().hex[:12]}@example.com"
        answer = session.post(f"{self.base_url}/api/auth/code", json={"email": email})
        assert answer.status_code == 200, answer.text
        code = latest_code(self.mail, email)
        answer = session.post(
            f"{self.base_url}/api/auth/verify", json={"email": email, "code": code}
        )
        assert answer.status_code == 200, answer.text
        return session

    def session(self, who: str) -> requests.Session:
        """The session of `who`: anonymous (no cookies at all) or signed in."""
        if who == "anonymous":
            self.anonymous.cookies.clear()
            return self.anonymous
        return self.signed_in


async def _cancel_the_rest() -> None:
    """End what the runner left (handlers of streams cut short) before the loop."""
    tasks = asyncio.all_tasks() - {asyncio.current_task()}
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def serving(settings: Settings, port: int, mail: MailCatcher) -> Iterator[Served]:
    """Run the app on 127.0.0.1:port in a thread until the block ends."""
    setup_log_hygiene()  # as `serve` does: malformed requests log one short line
    watch = LogWatch()
    watch.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(watch)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app", daemon=True)
    thread.start()

    def run(step: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(step, loop).result(_START_SECONDS)

    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, **handler_options())
    try:
        run(runner.setup())
        run(web.TCPSite(runner, "127.0.0.1", port).start())
        served = Served(app, f"http://127.0.0.1:{port}", watch, mail)
        served.signed_in = served.sign_in()
        try:
            yield served
        finally:
            served.anonymous.close()
            served.signed_in.close()
    finally:
        run(runner.cleanup())
        run(_cancel_the_rest())
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_START_SECONDS)
        loop.close()
        root.removeHandler(watch)


def error_of(content_type: str, content: bytes) -> Mapping[str, Any] | None:
    """Return a body if it is JSON with an `error` string, else None."""
    media = content_type.split(";")[0].strip().lower()
    if media not in ("application/json", "application/problem+json"):
        return None
    try:
        body = json.loads(content)
    except ValueError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return None
    return body


def error_body(response: requests.Response) -> Mapping[str, Any] | None:
    """Return a 4xx body if it is JSON with an `error` string, else None."""
    return error_of(response.headers.get("Content-Type", ""), response.content)


def describe(response: requests.Response) -> str:
    """One request and its answer, short enough for an assertion message."""
    request = response.request
    sent = request.body if isinstance(request.body, bytes) else str(request.body)
    return (
        f"{request.method} {request.url} -> {response.status_code} "
        f"{response.headers.get('Content-Type')}\n"
        f"  sent headers: {dict(request.headers)}\n"
        f"  sent body: {sent[:300]!r}\n  answer: {response.text[:300]!r}"
    )


def settings_variables(tmp: Path, port: int) -> dict[str, str]:
    """The variables of the fuzzed app: every route reachable and deep."""
    generous = {
        f"STUDIO_LIMITS_{name}_{part}": value
        for name in ("UPLOAD", "WRITE", "REPORT", "ORDERS", "MAIL_GLOBAL", "MAIL_FREE")
        for part, value in (("QUOTA", "1000000"), ("BURST", "500000"))
    }
    return {
        "STUDIO_BASE_URL": f"http://127.0.0.1:{port}",
        # Every model available (the demo), both channels (the fake provider,
        # served by this same app), so submits and orders go all the way.
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_PAYMENTS_FAKE": "1",
        "STUDIO_MEDIA_DIR": str(tmp / "media"),
        **generous,
    }
