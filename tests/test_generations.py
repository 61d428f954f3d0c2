"""Generations end to end: real Redis, real SMTP, real worker processes, real media."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import time
from pathlib import Path
from typing import Any

import av
import pytest
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import EVENTS
from service.studio.queue import GROUP, SHARDS, JobQueue, shard_of, stream

from .conftest import Client, Env, MakeClient, SettingsFactory
from .logs import troubles
from .ports import free_port
from .workbench import (
    balance,
    job_finished,
    ledger,
    sign_in,
    wait_for_status,
    worker_process,
)


async def _read(client: Client, gid: str) -> dict[str, Any]:
    response = await client.get(f"/api/generations/{gid}")
    assert response.status == 200
    body: dict[str, Any] = await response.json()
    return body


async def _submit(client: Client, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp", **body}
    )
    assert response.status == 202, await response.text()
    generation: dict[str, Any] = await response.json()
    return generation


async def test_an_image_goes_from_submit_to_a_real_png(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """Submit, watch it run on a worker process, fetch the PNG and its thumbnail."""
    client = await studio()
    await sign_in(client, mail_server)
    generation = await _submit(client, count=2, seed=7, size="1024x1024")
    assert generation["status"] == "queued"
    assert generation["credits"] == 12
    assert await balance(client) == 88
    with worker_process(studio_env):
        done = await wait_for_status(client, generation["id"], {"succeeded"})
    assert done["progress"] == 1.0
    assert done["refunded"] is False
    assert len(done["works"]) == 2
    for work in done["works"]:
        media = await client.get(work["media_url"])
        assert media.status == 200
        assert media.headers["Content-Type"] == "image/png"
        assert "immutable" in media.headers["Cache-Control"]
        assert media.headers["X-Content-Type-Options"] == "nosniff"
        image = Image.open(io.BytesIO(await media.read()))
        assert image.format == "PNG"
        assert image.size == (1024, 1024) == (work["width"], work["height"])
        thumb = await client.get(work["thumb_url"])
        assert thumb.headers["Content-Type"] == "image/webp"
        small = Image.open(io.BytesIO(await thumb.read()))
        assert max(small.size) == 512
        assert "duration" not in work
    kinds = [entry["kind"] for entry in await ledger(client)]
    assert kinds == ["grant", "debit"]


async def test_a_video_is_a_real_h264_mp4_of_the_models_length(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A video model gives an MP4 that PyAV decodes, with a poster and a duration."""
    client = await studio(STUDIO_TRIAL_CREDITS="500")
    await sign_in(client, mail_server)
    generation = await _submit(client, model="kling-2-1", size="1280x720")
    with worker_process(studio_env):
        done = await wait_for_status(client, generation["id"], {"succeeded"}, 60)
    (work,) = done["works"]
    assert abs(work["duration"] - 5) <= 0.5
    media = await client.get(work["media_url"], headers={"Range": "bytes=0-99"})
    assert media.status == 206
    full = await client.get(work["media_url"])
    container = av.open(io.BytesIO(await full.read()))
    stream = container.streams.video[0]
    assert stream.codec_context.name == "h264"
    assert (stream.width, stream.height) == (1280, 720)
    container.close()
    poster = await client.get(work["thumb_url"])
    assert Image.open(io.BytesIO(await poster.read())).format == "WEBP"


async def test_cancel_while_queued_refunds_at_once(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """No worker runs: the generation waits, and canceling gives everything back."""
    client = await studio()
    await sign_in(client, mail_server)
    generation = await _submit(client)
    response = await client.post(f"/api/generations/{generation['id']}/cancel")
    assert response.status == 200
    body = await response.json()
    assert body["status"] == "canceled"
    assert body["refunded"] is True
    assert await balance(client) == 100
    again = await client.post(f"/api/generations/{generation['id']}/cancel")
    assert again.status == 409
    assert await again.json() == {"error": "NOT_CANCELABLE"}
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]


async def test_cancel_while_running_stops_the_worker_and_discards_the_result(
    studio: MakeClient,
    mail_server: MailCatcher,
    studio_env: Env,
    tmp_path: Path,
    redis: Redis,
) -> None:
    """The worker stops at its next check; nothing it made is kept."""
    client = await studio()
    me = await sign_in(client, mail_server)
    generation = await _submit(client)
    env = {**studio_env, "STUDIO_DEMO_SECONDS": "5"}
    with worker_process(env):
        await wait_for_status(client, generation["id"], {"running"})
        response = await client.post(f"/api/generations/{generation['id']}/cancel")
        assert (await response.json())["status"] == "canceled"
        await job_finished(redis, me["id"], generation["id"])  # it heard and stopped
    body = await wait_for_status(client, generation["id"], {"canceled"})
    assert body["works"] == []
    assert await balance(client) == 100
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]
    media = tmp_path / "media"
    assert not media.exists() or not any(p.is_file() for p in media.rglob("*"))


async def test_a_passed_deadline_fails_the_generation_timed_out_and_refunds_once(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A job that cannot finish in time fails TIMED_OUT with one refund."""
    env = {**studio_env, "STUDIO_JOBS_IMAGE_DEADLINE": "1", "STUDIO_DEMO_SECONDS": "4"}
    client = await studio(STUDIO_JOBS_IMAGE_DEADLINE="1")
    await sign_in(client, mail_server)
    generation = await _submit(client)
    with worker_process(env):
        body = await wait_for_status(client, generation["id"], {"failed"}, 15)
        await asyncio.sleep(1.5)  # let the janitor see it too: still one refund
    assert body["error"] == "TIMED_OUT"
    assert body["refunded"] is True
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]
    assert await balance(client) == 100


async def test_an_entry_naming_no_job_among_a_dead_workers_does_not_stop_a_take_over(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env, redis: Redis
) -> None:
    """The take-over meets it with the job: it is dropped and the job runs."""
    client = await studio()
    shard = shard_of((await sign_in(client, mail_server))["id"])
    await JobQueue(redis).ensure_group()
    await redis.xadd(stream(shard), {"x": "written by hand"})
    generation = await _submit(client)
    # Both now belong to a worker that will never renew or finish them.
    await redis.xreadgroup(GROUP, "dead", {stream(shard): ">"})
    assert (await redis.xpending(stream(shard), GROUP))["pending"] == 2
    with worker_process({**studio_env, "STUDIO_JOBS_VISIBILITY_TIMEOUT": "2"}):
        await wait_for_status(client, generation["id"], {"succeeded"}, 20)
    assert await redis.xlen(stream(shard)) == 0  # the job's entry ended, the stray too
    assert await balance(client) == 100 - generation["credits"]


async def test_a_killed_worker_leaves_its_job_to_another_with_one_debit(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """SIGKILL mid-job: the job runs again elsewhere; the ledger charges once."""
    client = await studio()
    await sign_in(client, mail_server)
    generation = await _submit(client)
    slow = {**studio_env, "STUDIO_DEMO_SECONDS": "6"}
    with worker_process(slow) as doomed:
        running = await wait_for_status(client, generation["id"], {"running"})
        deadline = time.monotonic() + 20  # some progress is reported before the kill
        while (await _read(client, generation["id"]))["progress"] <= 0:
            assert time.monotonic() < deadline, "the worker reported no progress"
            await asyncio.sleep(0.05)
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
    held = await (await client.get(f"/api/generations/{generation['id']}")).json()
    assert held["status"] == "running"
    assert held["progress"] >= running["progress"]
    with worker_process({**studio_env, "STUDIO_DEMO_SECONDS": "0.5"}):
        done = await wait_for_status(client, generation["id"], {"succeeded"}, 30)
    assert len(done["works"]) == 1
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit"]
    assert await balance(client) == 94


async def test_a_worker_killed_holding_a_batch_from_several_shards_loses_no_job(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env, redis: Redis
) -> None:
    """One read took jobs of several shards; SIGKILL; another worker runs each once."""
    clients: list[Client] = []
    shards: set[int] = set()
    while len(clients) < 4 or len(shards) < 2:  # accounts spread over shards
        client = await studio()
        shards.add(shard_of((await sign_in(client, mail_server))["id"]))
        clients.append(client)
    generations = [await _submit(client) for client in clients]
    slow = {**studio_env, "STUDIO_DEMO_SECONDS": "30"}
    with worker_process(slow) as doomed:
        for client, generation in zip(clients, generations, strict=True):
            await wait_for_status(client, generation["id"], {"running"})
        pending = [
            await redis.xpending(stream(shard), GROUP) for shard in range(SHARDS)
        ]
        holding = [shard for shard, info in enumerate(pending) if info["pending"]]
        assert len(holding) == len(shards) >= 2  # one batch, several shards
        os.killpg(doomed.pid, signal.SIGKILL)
        doomed.wait()
    with worker_process({**studio_env, "STUDIO_DEMO_SECONDS": "0.2"}):
        for client, generation in zip(clients, generations, strict=True):
            done = await wait_for_status(client, generation["id"], {"succeeded"}, 30)
            assert len(done["works"]) == 1
    for client in clients:
        assert [e["kind"] for e in await ledger(client)] == ["grant", "debit"]
        assert await balance(client) == 94


async def test_the_same_idempotency_key_twenty_times_gives_one_generation(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Twenty concurrent submits with one key: one generation, one debit."""
    client = await studio()
    await sign_in(client, mail_server)
    headers = {"Idempotency-Key": "order-42"}
    body = {"model": "seedream-4", "prompt": "a lamp", "seed": 1}
    responses = await asyncio.gather(
        *(
            client.post("/api/generations", json=body, headers=headers)
            for _ in range(20)
        )
    )
    statuses = sorted(r.status for r in responses)
    assert statuses.count(202) == 1
    assert set(statuses) <= {200, 202, 409}
    ids = {(await r.json())["id"] for r in responses if r.status in (200, 202)}
    assert len(ids) == 1
    replay = await client.post("/api/generations", json=body, headers=headers)
    assert replay.status == 200
    assert replay.headers["Idempotent-Replayed"] == "true"
    other = await client.post(
        "/api/generations", json={**body, "seed": 2}, headers=headers
    )
    assert other.status == 422
    assert await other.json() == {"error": "IDEMPOTENCY_KEY_REUSED"}
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit"]


async def test_fifty_concurrent_submits_against_seven_prices_accept_exactly_seven(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """The balance covers seven: seven are charged, the rest are refused with 402."""
    client = await studio(STUDIO_TRIAL_CREDITS="42", STUDIO_JOBS_PER_USER="100")
    await sign_in(client, mail_server)
    body = {"model": "seedream-4", "prompt": "a lamp"}
    responses = await asyncio.gather(
        *(client.post("/api/generations", json=body) for _ in range(50))
    )
    statuses = [r.status for r in responses]
    assert statuses.count(202) == 7
    assert statuses.count(402) == 43
    refused = next(r for r in responses if r.status == 402)
    assert await refused.json() == {
        "error": "INSUFFICIENT_CREDITS",
        "balance": 0,
        "required": 6,
    }
    assert await balance(client) == 0
    entries = await ledger(client)
    assert [e["balance_after"] for e in entries] == [42, 36, 30, 24, 18, 12, 6, 0]


async def test_more_queued_jobs_than_the_cap_answer_too_many_jobs(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Four queued generations is the default cap; the fifth is refused, not charged."""
    client = await studio()
    await sign_in(client, mail_server)
    for _ in range(4):
        await _submit(client)
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "one more"}
    )
    assert response.status == 429
    assert await response.json() == {"error": "TOO_MANY_JOBS"}
    assert await balance(client) == 100 - 4 * 6


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "x"}, "model"),
        ({"model": "seedream-4"}, "prompt"),
        ({"model": "seedream-4", "prompt": "x", "style": "oil"}, "style"),
        ({"model": "nope", "prompt": "x"}, "model"),
        ({"model": 5, "prompt": "x"}, "model"),
        ({"model": "seedream-4", "prompt": "   "}, "prompt"),
        # nothing visible: zero-width space, BOM, a bidi mark, NUL
        ({"model": "seedream-4", "prompt": "\u200b\ufeff\u200f\x00"}, "prompt"),
        ({"model": "seedream-4", "prompt": "x" * 2001}, "prompt"),
        (
            {"model": "seedream-4", "prompt": "x", "negative_prompt": "n" * 1001},
            "negative_prompt",
        ),
        ({"model": "seedream-4", "prompt": "x", "size": "7x7"}, "size"),
        ({"model": "seedream-4", "prompt": "x", "count": 0}, "count"),
        ({"model": "seedream-4", "prompt": "x", "count": 5}, "count"),
        ({"model": "seedream-4", "prompt": "x", "count": True}, "count"),
        ({"model": "kling-2-1", "prompt": "x", "count": 2}, "count"),
        ({"model": "seedream-4", "prompt": "x", "seed": -1}, "seed"),
        ({"model": "seedream-4", "prompt": "x", "seed": 4294967296}, "seed"),
        ({"model": "seedream-4", "prompt": "x", "seed": 1.5}, "seed"),
        ({"model": "seedream-4", "prompt": "x", "reference": "nothere"}, "reference"),
        ({"model": "gpt-image-1", "prompt": "x", "reference": "abc"}, "reference"),
    ],
)
async def test_each_bad_field_is_named_and_nothing_is_charged(
    studio: MakeClient, mail_server: MailCatcher, body: dict[str, Any], field: str
) -> None:
    """A bad field answers 400 BAD_REQUEST with its name, before any charge."""
    client = await studio()
    await sign_in(client, mail_server)
    response = await client.post("/api/generations", json=body)
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST", "field": field}
    assert await balance(client) == 100


async def test_models_say_demo_and_are_unavailable_without_an_upstream(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """Without the demo and without upstream keys nothing can run: 400 on submit."""
    client = await aiohttp_client(create_app(make_settings()))
    models = await (await client.get("/api/models")).json()
    assert models["demo"] is False
    assert [m["id"] for m in models["models"]][:2] == ["seedream-4", "flux-kontext-pro"]
    assert not any(m["available"] for m in models["models"])
    video = next(m for m in models["models"] if m["kind"] == "video")
    image = next(m for m in models["models"] if m["kind"] == "image")
    assert video["seconds"] == 5
    assert "seconds" not in image
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "x"}
    )
    assert response.status == 400
    assert await response.json() == {"error": "MODEL_UNAVAILABLE"}


async def test_submit_with_redis_down_answers_503_and_charges_nothing(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    studio_env: Env,
    tmp_path: Path,
) -> None:
    """Redis stops between sign-in and submit: 503 UNAVAILABLE; back up, unchanged."""
    server = RedisServer(port=free_port(), data_dir=tmp_path / "redis")
    server.start()
    try:
        settings = make_settings(**{**studio_env, "STUDIO_REDIS_URL": server.url})
        client = await aiohttp_client(create_app(settings))
        await sign_in(client, mail_server)
        server.stop()
        response = await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": "x"}
        )
        assert response.status == 503
        assert await response.json() == {"error": "UNAVAILABLE"}
        server.start()
        assert await balance(client) == 100
        assert [e["kind"] for e in await ledger(client)] == ["grant"]
    finally:
        server.stop()


async def test_another_persons_generation_is_not_found(
    studio: MakeClient, aiohttp_client: AiohttpClient, mail_server: MailCatcher
) -> None:
    """Someone else's generation reads exactly like one that does not exist."""
    mine = await studio()
    await sign_in(mine, mail_server)
    generation = await _submit(mine)
    theirs = await studio()
    await sign_in(theirs, mail_server)
    for path in (f"/api/generations/{generation['id']}", "/api/generations/zzz"):
        response = await theirs.get(path)
        assert response.status == 404
        assert await response.json() == {"error": "NOT_FOUND"}
    cancel = await theirs.post(f"/api/generations/{generation['id']}/cancel")
    assert cancel.status == 404


async def test_generations_and_credits_page_without_repeats(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Cursor pages cover every item once, newest first; bad cursors are refused."""
    client = await studio(STUDIO_JOBS_PER_USER="20")
    await sign_in(client, mail_server)
    made = [(await _submit(client, prompt=f"p{i}"))["id"] for i in range(5)]
    seen: list[str] = []
    cursor = ""
    while True:
        page = await (
            await client.get(f"/api/generations?limit=2&cursor={cursor}")
        ).json()
        seen += [item["id"] for item in page["items"]]
        if not page["next_cursor"]:
            break
        cursor = page["next_cursor"]
    assert seen == list(reversed(made))
    entries = await ledger(client)
    assert sum(e["amount"] for e in entries) == await balance(client) == 70
    for query in ("limit=0", "limit=51", "limit=x", "cursor=bogus", "sort=new"):
        response = await client.get(f"/api/generations?{query}")
        assert response.status == 400
        assert (await response.json())["error"] == "BAD_REQUEST"


async def test_events_stream_the_balance_and_a_generations_progress(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """The stream opens with a snapshot, then relays a worker's changes live."""
    client = await studio()
    await sign_in(client, mail_server)
    events: list[tuple[str, Any]] = []
    import json

    async def listen() -> None:
        async with client.get("/api/events") as response:
            assert response.status == 200
            assert response.headers["Content-Type"].startswith("text/event-stream")
            name = ""
            async for raw in response.content:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    events.append((name, json.loads(line[6:])))
                    opened.set()  # the snapshot came: the stream is subscribed
                    data = events[-1][1]
                    if name == "generation" and data["status"] == "succeeded":
                        return

    opened = asyncio.Event()
    listener = asyncio.create_task(listen())
    await asyncio.wait_for(opened.wait(), 10)
    generation = await _submit(client)
    with worker_process(studio_env):
        await asyncio.wait_for(listener, 30)
    assert events[0] == ("credits", {"balance": 100})
    assert ("credits", {"balance": 94}) in events
    progress = [d["progress"] for n, d in events if n == "generation"]
    assert progress == sorted(progress)
    statuses = [d["status"] for n, d in events if n == "generation"]
    assert statuses[0] == "queued"
    assert statuses[-1] == "succeeded"
    assert "running" in statuses
    assert all(d["id"] == generation["id"] for n, d in events if n == "generation")


async def test_upstream_failure_refunds_exactly_once(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env, redis: Redis
) -> None:
    """An upstream that refuses fails the generation with one refund, even twice run."""
    from service.content import load_content
    from service.settings import load_settings
    from service.studio.media.store import DirectoryStore
    from service.studio.upstreams.base import (
        Output,
        Progress,
        Request,
        UpstreamError,
    )
    from service.studio.worker import Worker

    class Refusing:
        """An upstream that says the prompt breaks its content policy."""

        async def generate(self, request: Request, progress: Progress) -> list[Output]:
            await progress(0.5)
            raise UpstreamError("CONTENT_BLOCKED", transient=False)

        async def aclose(self) -> None:
            """Nothing to close."""

    client = await studio()
    await sign_in(client, mail_server)
    generation = await _submit(client)
    settings = load_settings({**studio_env}).workbench
    for _ in range(2):  # a second delivery of the same job changes nothing
        worker = Worker(
            redis=redis,
            content=load_content(),
            settings=settings,
            media=DirectoryStore(settings.media_dir),
            upstream_for=lambda model: Refusing(),
        )
        stop = asyncio.Event()
        task = asyncio.create_task(worker.run(stop))
        await wait_for_status(client, generation["id"], {"failed"}, 10)
        stop.set()
        await task
    body = await (await client.get(f"/api/generations/{generation['id']}")).json()
    assert body["error"] == "CONTENT_BLOCKED"
    assert body["refunded"] is True
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]
    assert await balance(client) == 100


async def test_the_event_stream_ends_when_its_session_logs_out(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Signing out closes the stream that session opened, on any process."""
    client = await studio()
    await sign_in(client, mail_server)
    lines: list[str] = []
    opened = asyncio.Event()

    async def listen() -> None:
        async with client.get("/api/events") as response:
            async for raw in response.content:
                lines.append(raw.decode())
                opened.set()

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(opened.wait(), 10)
    assert (await client.post("/api/auth/logout")).status == 204
    await asyncio.wait_for(listener, 10)  # the server ended the stream
    assert any(line.startswith("event: credits") for line in lines)


async def test_a_client_gone_before_an_event_is_a_quiet_end_of_its_stream(
    studio: MakeClient, mail_server: MailCatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """Leaving is how every stream ends: a debug line, not "store unavailable"."""
    client = await studio()
    me = await sign_in(client, mail_server)
    caplog.set_level(logging.DEBUG)
    async with client.get("/api/events") as response:
        assert response.status == 200
        assert (await response.content.readline()).startswith(b"id: ")
        response.close()  # the client goes away with the stream open
    await asyncio.sleep(0.1)  # the server learns of it only when it writes
    hub = client.app[EVENTS]
    hub.signal(me["id"], {"event": "credits", "data": {"balance": 1}})
    for _ in range(250):
        if "event stream" in caplog.text or troubles(caplog):
            break
        await asyncio.sleep(0.02)
    assert troubles(caplog) == []
    assert "event stream closed by the client" in caplog.text
