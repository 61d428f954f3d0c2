"""Try again and cancel all: real Redis, the real app, a real worker process."""

from __future__ import annotations

import asyncio
from typing import Any

from service.store.embedded import MailCatcher

from .conftest import Client, Env, MakeClient
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process


async def _submit(client: Client, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/api/generations",
        json={"model": "seedream-4", "prompt": "a lamp", **body},
    )
    assert response.status == 202, await response.text()
    generation: dict[str, Any] = await response.json()
    return generation


async def test_a_canceled_generation_tried_again_is_a_new_one_charged_anew(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Same model, prompt, size, count, seed and preset; a new id and a new debit."""
    client = await studio()
    await sign_in(client, mail_server)
    first = await _submit(client, count=2, seed=42, size="1024x1024", preset="photo")
    await client.post(f"/api/generations/{first['id']}/cancel")
    assert await balance(client) == 100
    response = await client.post(f"/api/generations/{first['id']}/retry")
    assert response.status == 202, await response.text()
    again = await response.json()
    assert again["id"] != first["id"]
    assert again["status"] == "queued"
    for name in ("model", "prompt", "negative_prompt", "size", "count", "seed"):
        assert again[name] == first[name], name
    assert again["preset"] == "photo"
    assert again["prompt"].count("photorealistic") == 1  # the suffix once
    assert await balance(client) == 100 - again["credits"]
    kinds = [(e["kind"], e["generation_id"]) for e in await ledger(client)]
    assert kinds[-1] == ("debit", again["id"])


async def test_a_retry_keeps_the_seed_on_a_model_without_a_seed_control(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """gpt-image-2 takes no seed from the body, yet its retry shows the same one."""
    client = await studio()
    await sign_in(client, mail_server)
    first = await _submit(client, model="gpt-image-2")
    await client.post(f"/api/generations/{first['id']}/cancel")
    response = await client.post(f"/api/generations/{first['id']}/retry")
    assert response.status == 202, await response.text()
    assert (await response.json())["seed"] == first["seed"]


async def test_retry_of_a_queued_or_succeeded_generation_is_409(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """Only failed and canceled ones can be tried again; others' are 404."""
    client, other = await studio(), await studio()
    await sign_in(client, mail_server)
    await sign_in(other, mail_server)
    queued = await _submit(client)
    response = await client.post(f"/api/generations/{queued['id']}/retry")
    assert response.status == 409
    assert await response.json() == {"error": "NOT_RETRYABLE"}
    with worker_process(studio_env):
        await wait_for_status(client, queued["id"], {"succeeded"})
    response = await client.post(f"/api/generations/{queued['id']}/retry")
    assert (response.status, await response.json()) == (
        409,
        {"error": "NOT_RETRYABLE"},
    )
    assert (await other.post(f"/api/generations/{queued['id']}/retry")).status == 404
    assert (await client.post("/api/generations/nothere/retry")).status == 404


async def test_retry_answers_the_errors_of_submit_and_honours_its_key(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Too poor: 402 and nothing charged; the same key twice: one new generation."""
    client = await studio(STUDIO_JOBS_PER_USER="10")
    await sign_in(client, mail_server)
    first = await _submit(client, count=4)  # 24 credits
    await client.post(f"/api/generations/{first['id']}/cancel")
    headers = {"Idempotency-Key": "again-1"}
    one = await client.post(f"/api/generations/{first['id']}/retry", headers=headers)
    two = await client.post(f"/api/generations/{first['id']}/retry", headers=headers)
    assert (one.status, two.status) == (202, 200)
    assert two.headers["Idempotent-Replayed"] == "true"
    assert (await one.json())["id"] == (await two.json())["id"]
    assert await balance(client) == 76
    for _ in range(3):
        await _submit(client, count=4)
    assert await balance(client) == 4
    poor = await client.post(f"/api/generations/{first['id']}/retry")
    assert poor.status == 402
    assert await balance(client) == 4
    assert (await poor.json())["error"] == "INSUFFICIENT_CREDITS"


async def test_cancel_all_queued_refunds_each_once_and_leaves_running_ones(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A worker runs one job while cancel-all races it: every refund exactly once."""
    client = await studio()
    await sign_in(client, mail_server)
    jobs = [await _submit(client) for _ in range(4)]
    env = {**studio_env, "STUDIO_WORKER_CONCURRENCY": "1", "STUDIO_DEMO_SECONDS": "3"}
    with worker_process(env):
        await wait_for_status(client, jobs[0]["id"], {"running"})
        response = await client.post(
            "/api/generations/cancel", json={"status": "queued"}
        )
        assert response.status == 200
        assert await response.json() == {"canceled": 3}
        again = await client.post("/api/generations/cancel", json={"status": "queued"})
        assert await again.json() == {"canceled": 0}
        await wait_for_status(client, jobs[0]["id"], {"succeeded"})
    statuses = [
        (await wait_for_status(client, j["id"], {"succeeded", "canceled"}))["status"]
        for j in jobs
    ]
    assert statuses == ["succeeded", "canceled", "canceled", "canceled"]
    entries = await ledger(client)
    refunds = [e["generation_id"] for e in entries if e["kind"] == "refund"]
    assert sorted(refunds) == sorted(j["id"] for j in jobs[1:])
    assert await balance(client) == 100 - 6


async def test_cancel_all_stops_running_jobs_too_and_refunds_them_once(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """`all` takes the running ones as well; the worker's late result is dropped."""
    client = await studio()
    await sign_in(client, mail_server)
    jobs = [await _submit(client) for _ in range(3)]
    env = {**studio_env, "STUDIO_WORKER_CONCURRENCY": "2", "STUDIO_DEMO_SECONDS": "3"}
    with worker_process(env):
        await wait_for_status(client, jobs[0]["id"], {"running"})
        await wait_for_status(client, jobs[1]["id"], {"running"})
        answers = await asyncio.gather(
            *[
                client.post("/api/generations/cancel", json={"status": "all"})
                for _ in range(3)
            ]
        )
        counts = [(await a.json())["canceled"] for a in answers]
        assert sum(counts) == 3
        await asyncio.sleep(3.5)
    for job in jobs:
        assert (await wait_for_status(client, job["id"], {"canceled"}))["works"] == []
    refunds = [e for e in await ledger(client) if e["kind"] == "refund"]
    assert len(refunds) == 3
    assert await balance(client) == 100


async def test_cancel_all_refuses_anything_but_queued_or_all(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """A missing or unknown status is a 400 naming the field."""
    client = await studio()
    await sign_in(client, mail_server)
    for body in ({"status": "running"}, {"status": 1}):
        response = await client.post("/api/generations/cancel", json=body)
        assert response.status == 400
        assert (await response.json())["field"] == "status"
    response = await client.post("/api/generations/cancel", json={})
    assert response.status == 400
