"""The real app served on a port of its own, for fuzzers that speak plain HTTP.

Schemathesis and hypothesis call synchronously (`requests`), so the app runs
on its own event loop in a thread, built by `create_app(settings)` and served
with the handler options `serve` uses. Every log record the service writes at
INFO or above (what `serve` logs) is kept, so a test can say which request made
a traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
import traceback
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
from aiohttp import web

from service.app import create_app
from service.keys import CLOCK, CONTENT, REDIS, SETTINGS
from service.metrics import METRICS
from service.settings import Settings
from service.store.embedded import MailCatcher
from service.studio.keys import MEDIA
from service.studio.upstreams.registry import Upstreams
from service.studio.worker import Worker
from service.web.hardening import handler_options, setup_log_hygiene

from .conftest import latest_code

# What a started or stopped app may take at most, in seconds.
_START_SECONDS: Final = 30.0
# Log lines that say a request broke something, whatever their level.
_BROKEN: Final = ("Traceback", "store unavailable")


class LogWatch(logging.Handler):
    """Keep every record at INFO or above; hand over the ones that show a fault."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
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
    # Real ids of the signed-in account's things, by path parameter name.
    known: dict[str, list[str]] = field(default_factory=dict)

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

    def post(self, path: str, body: Any = None) -> Any:
        """POST JSON as the signed-in browser; return the JSON answer."""
        answer = self.signed_in.post(
            self.base_url + path, json=body, headers=self.same_origin(), timeout=10
        )
        assert answer.status_code in (200, 201, 202), answer.text
        return answer.json()

    def session(self, who: str) -> requests.Session:
        """The session of `who`: anonymous (no cookies at all) or signed in."""
        if who == "anonymous":
            self.anonymous.cookies.clear()
            return self.anonymous
        return self.signed_in


def _plain_traceback(error: BaseException) -> str:
    """Format a traceback as the logging module does, less the ^^^ marks."""
    formatted = traceback.TracebackException.from_exception(error)
    pending, seen = [formatted], set()
    while pending:
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        for frame in part.stack:
            frame.colno = None  # no marks: placing them calls ast.parse
        pending += [e for e in (part.__cause__, part.__context__) if e is not None]
        pending += getattr(part, "exceptions", None) or []
    return "".join(formatted.format()).rstrip("\n")


@contextlib.contextmanager
def _tracebacks_formatted_in_place(thread: threading.Thread) -> Iterator[None]:
    """Format the app thread's tracebacks as its records are made, without marks.

    Python 3.11 places a traceback's ^^^ marks with ast.parse, whose recursion
    count all threads share: a log handler formatting one in the app's thread
    while pytest parses a failing test's source in the main thread can make
    that parse fail with SystemError, an INTERNALERROR that ends the run
    instead of reporting the failure.
    """
    make = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make(*args, **kwargs)
        error = record.exc_info[1] if record.exc_info else None
        if error is not None and threading.current_thread() is thread:
            record.exc_text = _plain_traceback(error)
        return record

    logging.setLogRecordFactory(factory)
    try:
        yield
    finally:
        logging.setLogRecordFactory(make)


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
    level = root.level
    root.setLevel(logging.INFO)  # as `serve` logs: a traceback at INFO counts too
    root.addHandler(watch)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="app", daemon=True)
    thread.start()
    stack = contextlib.ExitStack()
    stack.enter_context(_tracebacks_formatted_in_place(thread))

    def run(step: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(step, loop).result(_START_SECONDS)

    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, **handler_options())
    try:
        run(runner.setup())
        run(web.TCPSite(runner, "127.0.0.1", port).start())
        served = Served(app, f"http://127.0.0.1:{port}", watch, mail)
        served.signed_in = served.sign_in()
        served.known = _seed(served, run)
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
        stack.close()
        root.removeHandler(watch)
        root.setLevel(level)


def _seed(served: Served, run: Callable[[Awaitable[Any]], Any]) -> dict[str, list[str]]:
    """Give the signed-in account real things for the fuzzer to aim at.

    A generation that succeeded (its three works, one published and reported,
    one to be deleted), one left queued, an order with a QR code, an export: path
    parameters can then name something that exists, so the fuzz reaches each
    handler past its 404. Keys are parameter names, or `operationId:name`.
    """
    done = served.post(
        "/api/generations",
        {"model": "seedream-4", "prompt": "a lighthouse at dusk", "count": 3},
    )["id"]
    stop, task = run(_start_worker(served.app))
    try:
        works = _wait_for_works(served, done)
    finally:
        run(_stop_worker(stop, task))
    served.post(f"/api/works/{works[0]}/publish")
    report = served.post(
        f"/api/square/{works[0]}/report", {"reason": "a test", "category": "other"}
    )["id"]
    queued = served.post(
        "/api/generations", {"model": "flux-kontext-pro", "prompt": "a quiet harbour"}
    )["id"]
    order = served.post(
        "/api/orders", {"pack": "p30", "channel": "wechatpay", "device": "desktop"}
    )["id"]
    export = served.post("/api/account/export")["id"]
    return {
        "gid": [done, queued],
        "wid": works[:2],
        # DELETE gets a work of its own: the others stay for the routes after it.
        "work_delete:wid": works[2:],
        "work_id": works[:1],
        "oid": [order],
        "eid": [export],
        "report_id": [report],
    }


async def _start_worker(app: web.Application) -> tuple[asyncio.Event, Any]:
    """Run a worker in the app's loop, as `make run` does, until told to stop."""
    worker = Worker(
        redis=app[REDIS],
        content=app[CONTENT],
        settings=app[SETTINGS].workbench,
        media=app[MEDIA],
        upstream_for=Upstreams(app[SETTINGS].workbench),  # the demo: none to close
        metrics=app[METRICS],
        wait_replicas=app[SETTINGS].redis_wait_replicas,
        clock=app[CLOCK],
    )
    stop = asyncio.Event()
    return stop, asyncio.create_task(worker.run(stop), name="seed-worker")


async def _stop_worker(stop: asyncio.Event, task: Awaitable[None]) -> None:
    stop.set()
    await task


def _wait_for_works(served: Served, gid: str) -> list[str]:
    """Poll a generation until it succeeded; return its works' ids."""
    deadline = time.monotonic() + _START_SECONDS
    while time.monotonic() < deadline:
        answer = served.signed_in.get(f"{served.base_url}/api/generations/{gid}")
        body = answer.json()
        assert body["status"] in ("queued", "running", "succeeded"), body
        if body["status"] == "succeeded":
            return [work["id"] for work in body["works"]]
        time.sleep(0.05)
    raise AssertionError(f"the seed generation {gid} never succeeded")


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
        "STUDIO_DEMO_SECONDS": "0",
        "STUDIO_PAYMENTS_FAKE": "1",
        "STUDIO_MEDIA_DIR": str(tmp / "media"),
        **generous,
    }
