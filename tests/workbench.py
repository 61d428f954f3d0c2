"""Helpers for workbench tests: a signed-in client and real worker processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from service.settings import ROOT
from service.store.embedded import MailCatcher
from service.studio.queue import prefix, shard_of

from .conftest import Client, latest_code
from .processes import drain, output_of, studio_environ


def new_address() -> str:
    """Return an address nobody has used yet."""
    return f"maker-{uuid.uuid4().hex[:10]}@example.com"


async def sign_in(
    client: Client, mail_server: MailCatcher, email: str | None = None
) -> dict[str, Any]:
    """Sign in through the real endpoints; the client's jar keeps the cookie."""
    email = email or new_address()
    response = await client.post("/api/auth/code", json={"email": email})
    assert response.status == 200, await response.text()
    code = latest_code(mail_server, email)
    response = await client.post(
        "/api/auth/verify", json={"email": email, "code": code}
    )
    assert response.status == 200, await response.text()
    user: dict[str, Any] = (await response.json())["user"]
    return user


async def balance(client: Client) -> int:
    """Read my balance from /api/credits."""
    response = await client.get("/api/credits")
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return int(body["balance"])


async def ledger(client: Client) -> list[dict[str, Any]]:
    """Read my whole ledger, oldest first, page by page."""
    entries: list[dict[str, Any]] = []
    cursor = ""
    while True:
        response = await client.get(f"/api/credits?limit=50&cursor={cursor}")
        assert response.status == 200, await response.text()
        body = await response.json()
        entries += body["entries"]
        if not body["next_cursor"]:
            return list(reversed(entries))
        cursor = body["next_cursor"]


async def wait_for_status(
    client: Client, gid: str, statuses: set[str], within: float = 30.0
) -> dict[str, Any]:
    """Poll a generation until it reaches one of the statuses."""
    deadline = time.monotonic() + within
    body: dict[str, Any] = {}
    while time.monotonic() < deadline:
        response = await client.get(f"/api/generations/{gid}")
        if response.status == 503:  # shed on a busy machine: ask again, as told
            await _sleep(0.05)
            continue
        assert response.status == 200, await response.text()
        body = await response.json()
        if body["status"] in statuses:
            return body
        await _sleep(0.05)
    raise AssertionError(f"{gid} stayed {body.get('status')}, not in {statuses}")


async def job_finished(
    redis: Redis, account_id: str, gid: str, within: float = 20.0
) -> None:
    """Wait until a worker is done with a job: its queue record is deleted."""
    record = f"{prefix(shard_of(account_id))}:job:{gid}"
    deadline = time.monotonic() + within
    while await redis.exists(record):
        assert time.monotonic() < deadline, f"no worker finished {gid}"
        await _sleep(0.02)


async def _sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@contextmanager
def worker_process(variables: Mapping[str, str]) -> Iterator[subprocess.Popen[str]]:
    """Run `python -m service worker` as operators do; SIGTERM it at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "service", "worker"],
        cwd=ROOT,
        env=studio_environ(**dict(variables)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    reader = drain(process)
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        reader.join(timeout=5)
        if process.stdout:
            process.stdout.close()
        # Shown by pytest with a failed test's captured output.
        print(f"--- worker {process.pid}:\n{output_of(process).text()}")


@dataclass(frozen=True)
class Finished:
    """What an operator command printed and how it exited."""

    returncode: int
    stdout: str
    stderr: str


async def studio_command(*args: str, environ: Mapping[str, str]) -> Finished:
    """Run `python -m service ARGS...` as an operator would, without blocking."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "service", *args,
        cwd=ROOT, env=dict(environ),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    stdout, stderr = await asyncio.wait_for(process.communicate(), 30)
    return Finished(process.returncode or 0, stdout.decode(), stderr.decode())
