"""The prompt check: refused before anything is charged, queued or kept; logged."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from service.content import CONTENT_DIR
from service.keys import SETTINGS
from service.moderation.log import ModerationLog
from service.moderation.prompts import MODERATION
from service.store.embedded import MailCatcher
from service.studio.queue import JobQueue

from .conftest import Client, MakeClient
from .test_library import make_works
from .workbench import balance, ledger, sign_in

BLOCKED = "一张兒童 色情的图"  # the packaged list's 儿童色情, traditional and spaced


# The moderation log's keys, and sign-in's rate-limit buckets (which expire).
_NOT_COMPARED = (b"studio:modlog:", b"studio:rl:")


async def snapshot(redis: Redis) -> dict[bytes, bytes | None]:
    """Every key and its serialized value, but the log's and the buckets'."""
    keys = [key async for key in redis.scan_iter() if not key.startswith(_NOT_COMPARED)]
    return {key: await redis.dump(key) for key in sorted(keys)}


async def records(client: Client, redis: Redis) -> list[dict[str, str]]:
    days = client.app[SETTINGS].workbench.moderation.log_days
    return [record async for record in ModerationLog(redis, days).read()]


async def _state(client: Client, redis: Redis) -> tuple[Any, ...]:
    generations = await (await client.get("/api/generations")).json()
    return (
        await balance(client),
        await ledger(client),
        generations["items"],
        await JobQueue(redis).depth(),
        await snapshot(redis),
    )


async def test_a_blocked_prompt_charges_nothing_and_is_logged_once(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """400 with its field; balance, ledger, generations, queue and keys unchanged."""
    client = await studio()
    user = await sign_in(client, mail_server)
    before = await _state(client, redis)
    response = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": BLOCKED},
        headers={"Idempotency-Key": "k1"},
    )
    assert response.status == 400
    assert await response.json() == {"error": "CONTENT_BLOCKED", "field": "prompt"}
    response = await client.post(
        "/api/generations",
        json={
            "model": "qwen-image-2-pro",
            "prompt": "a lamp",
            "negative_prompt": "CHILD PORN",
        },
    )
    assert await response.json() == {
        "error": "CONTENT_BLOCKED",
        "field": "negative_prompt",
    }
    assert await _state(client, redis) == before
    logged = await records(client, redis)
    assert [(r["source"], r["verdict"], r["field"], r["rule"]) for r in logged] == [
        ("prompt", "blocked", "prompt", "儿童色情"),
        ("prompt", "blocked", "negative_prompt", "child porn"),
    ]
    assert logged[0]["account"] == user["id"]
    assert logged[0]["text"] == BLOCKED
    assert "at" in logged[0]
    # The same key again, now with an innocent prompt: nothing was remembered.
    response = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp"},
        headers={"Idempotency-Key": "k1"},
    )
    assert response.status == 202, await response.text()


async def test_fifty_concurrent_blocked_submits_change_nothing(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """Under concurrency too: fifty refusals, fifty log records, no other write."""
    client = await studio()
    await sign_in(client, mail_server)
    before = await _state(client, redis)

    async def submit(index: int) -> tuple[int, Any]:
        response = await client.post(
            "/api/generations",
            json={"model": "seedream-4", "prompt": f"{index} 儿-童-色-情"},
            headers={"Idempotency-Key": f"key-{index % 7}"},
        )
        return response.status, await response.json()

    answers = await asyncio.gather(*(submit(index) for index in range(50)))
    assert answers == [(400, {"error": "CONTENT_BLOCKED", "field": "prompt"})] * 50
    assert await _state(client, redis) == before
    assert len(await records(client, redis)) == 50


async def test_fields_are_checked_first_and_the_balance_after(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """A bad field answers as before; a blocked prompt beats an empty balance."""
    client = await studio(STUDIO_TRIAL_CREDITS="0")
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": BLOCKED, "size": "1x1"},
    )
    assert await response.json() == {"error": "BAD_REQUEST", "field": "size"}
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": BLOCKED}
    )
    assert await response.json() == {"error": "CONTENT_BLOCKED", "field": "prompt"}
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
    )
    assert response.status == 402
    assert len(await records(client, redis)) == 1


async def test_a_blocked_prompt_is_refused_before_its_key_is_looked_up(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis
) -> None:
    """CONTRACT §11: after the fields, before the idempotency check.

    A key already spent on an innocent prompt, sent again with a blocked one,
    gets CONTENT_BLOCKED (and a log record), not 422; a bad field with that key
    still answers the key's 422 first (§6, details 1).
    """
    client = await studio()
    await sign_in(client, mail_server)
    first = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp"},
        headers={"Idempotency-Key": "spent"},
    )
    assert first.status == 202
    before = await _state(client, redis)
    blocked = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": BLOCKED},
        headers={"Idempotency-Key": "spent"},
    )
    assert blocked.status == 400
    assert await blocked.json() == {"error": "CONTENT_BLOCKED", "field": "prompt"}
    assert [r["rule"] for r in await records(client, redis)] == ["儿童色情"]
    bad = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp", "size": "1x1"},
        headers={"Idempotency-Key": "spent"},
    )
    assert (bad.status, await bad.json()) == (
        422,
        {"error": "IDEMPOTENCY_KEY_REUSED"},
    )
    replay = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp"},
        headers={"Idempotency-Key": "spent"},
    )
    assert replay.status == 200
    assert (await replay.json())["id"] == (await first.json())["id"]
    assert await _state(client, redis) == before


async def test_publish_checks_the_prompt_against_the_list_in_force(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """A term added after the generation still keeps its work off the square."""
    content = tmp_path / "content"
    shutil.copytree(CONTENT_DIR, content)
    listed = content / "moderation" / "blocked.txt"
    listed.write_text("# nothing yet\n", encoding="utf-8")
    client = await studio(
        STUDIO_CONTENT_DIR=str(content), STUDIO_MODERATION_RELOAD_SECONDS="0.1"
    )
    user = await sign_in(client, mail_server)
    works = await make_works(redis, tmp_path, user["id"], 2)
    listed.write_text("PROMPT 0\n", encoding="utf-8")
    for _ in range(100):
        if client.app[MODERATION].verdict("prompt 0"):
            break
        await asyncio.sleep(0.05)
    blocked, allowed = works[0]["id"], works[1]["id"]
    response = await client.post(f"/api/works/{blocked}/publish")
    assert response.status == 400
    assert await response.json() == {"error": "CONTENT_BLOCKED", "field": "prompt"}
    response = await client.post(f"/api/works/{allowed}/publish")
    assert response.status == 200, await response.text()
    square = await (await client.get("/api/square")).json()
    assert [item["id"] for item in square["items"]] == [allowed]
    mine = await (await client.get(f"/api/works/{blocked}")).json()
    assert mine["published_at"] is None
    (record,) = await records(client, redis)
    assert (record["source"], record["work"], record["rule"]) == (
        "publish",
        blocked,
        "PROMPT 0",
    )
