"""Three app processes and two workers on one Redis behave as one service."""

from __future__ import annotations

import asyncio
import json
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, latest_code
from .processes import running
from .workbench import new_address, worker_process


async def _events(
    session: aiohttp.ClientSession, url: str, seen: list[Any], opened: asyncio.Event
) -> None:
    """Collect generation events until one succeeds."""
    async with session.get(f"{url}/api/events") as response:
        assert response.status == 200
        name = ""
        async for raw in response.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                seen.append((name, data))
                opened.set()
                if name == "generation" and data["status"] == "succeeded":
                    return


async def test_three_app_processes_and_two_workers_are_one_service(
    redis_server: RedisServer, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """One limit budget, sessions everywhere, events across processes, fresh square."""
    variables = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_SMTP_HOST": mail_server.host,
        "STUDIO_SMTP_PORT": str(mail_server.port),
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "1",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_LIMITS_GALLERY_QUOTA": "40",
        "STUDIO_LIMITS_GALLERY_BURST": "30",
    }
    with ExitStack() as stack:
        apps = [stack.enter_context(running("serve", variables))[0] for _ in range(3)]
        for _ in range(2):
            stack.enter_context(worker_process(variables))
        jar = aiohttp.CookieJar(unsafe=True)  # one browser, three origins' ports
        async with aiohttp.ClientSession(cookie_jar=jar) as browser:
            email = new_address()
            async with browser.post(f"{apps[0]}/api/auth/code", json={"email": email}):
                pass
            code = latest_code(mail_server, email)
            verify = {"email": email, "code": code}
            async with browser.post(f"{apps[0]}/api/auth/verify", json=verify) as r:
                assert r.status == 200
            for app in apps:  # the session is valid on every process
                async with browser.get(f"{app}/api/me") as r:
                    assert r.status == 200
                    assert (await r.json())["email"] == email

            # a generation submitted on one process streams to another's client
            seen: list[Any] = []
            opened = asyncio.Event()
            listener = asyncio.create_task(_events(browser, apps[2], seen, opened))
            await asyncio.wait_for(opened.wait(), 10)  # subscribed: snapshot came
            body = {"model": "seedream-4", "prompt": "three processes"}
            async with browser.post(f"{apps[0]}/api/generations", json=body) as r:
                assert r.status == 202
                gid = (await r.json())["id"]
            await asyncio.wait_for(listener, 30)
            done = [d for n, d in seen if n == "generation" and d["id"] == gid]
            assert done[-1]["status"] == "succeeded"
            work_id = done[-1]["works"][0]["id"]

            # published on one, cached on all, unpublished: gone everywhere at once
            async with browser.post(f"{apps[1]}/api/works/{work_id}/publish") as r:
                assert r.status == 200
            for app in apps:
                async with browser.get(f"{app}/api/square") as r:
                    assert work_id in [i["id"] for i in (await r.json())["items"]]
            async with browser.delete(f"{apps[0]}/api/works/{work_id}/publish") as r:
                assert r.status == 200
            for app in apps:
                async with browser.get(f"{app}/api/square") as r:
                    assert work_id not in [i["id"] for i in (await r.json())["items"]]

        # one budget: a client on another address spends the burst once, not thrice
        connector = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0))
        async with aiohttp.ClientSession(connector=connector) as visitor:
            statuses = []
            for index in range(45):
                app = apps[index % 3]
                async with visitor.get(f"{app}/api/square") as r:
                    statuses.append(r.status)
        assert statuses.count(200) == 30
        assert statuses.count(429) == 15
