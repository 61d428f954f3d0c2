"""The `fal` protocol against a fake fal queue on loopback, through the real worker."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import FormData
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.content import load_content
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.upstreams import fal
from service.studio.upstreams.base import Request
from service.studio.upstreams.inputs import log_fraction, says_blocked

from .conftest import Client, SettingsFactory
from .upstream_fakes import FAL_ERRORS, REPLICATE_SENSITIVE, Canned, FakeFal, png
from .upstream_jobs import (
    assert_books,
    finished,
    running_worker,
    submit,
    until,
    upstream_env,
)
from .workbench import balance, sign_in, wait_for_status, worker_process

KEY = "fal-test-key-1b2c3d4e5f60718293a4b5c6"
SEEDREAM = "fal-ai/bytedance/seedream/v4/text-to-image"
KLING = "fal-ai/kling-video/v2.1/master/text-to-video"


@pytest.fixture
async def fake() -> AsyncIterator[FakeFal]:
    """A fal queue on loopback that knows our key."""
    async with FakeFal(KEY) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, redis_server: RedisServer, fake: FakeFal) -> dict[str, str]:
    """Settings of the app and its workers: the `fal` upstream is the fake."""
    return upstream_env(tmp_path, redis_server.url, "fal", fake.base_url, KEY)


@pytest.fixture
def settings(make_settings: SettingsFactory, env: dict[str, str]) -> Settings:
    """The settings both the app and the worker load."""
    return make_settings(**env)


@pytest.fixture
async def client(
    aiohttp_client: AiohttpClient,
    settings: Settings,
    mail_server: MailCatcher,
    redis: Redis,
) -> Client:
    """A signed-in person on the real app (after `redis` has emptied the store)."""
    client = await aiohttp_client(create_app(settings))
    await sign_in(client, mail_server)
    return client


def submits(fake: FakeFal) -> list[Any]:
    """The submit requests the fake received (every POST is one)."""
    return [r for r in fake.requests if r.method == "POST"]


async def test_an_image_model_runs_on_fal_from_submit_to_stored_pngs(
    client: Client, fake: FakeFal, env: dict[str, str]
) -> None:
    """Seedream: our size, count and seed in fal's fields; two PNG works; one debit."""
    with worker_process(env):
        generation = await submit(
            client, model="seedream-4", prompt="a lamp", size="1536x1024", count=2,
            seed=7,
        )  # fmt: skip
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0
    (sent,) = submits(fake)
    assert sent.path == "/" + SEEDREAM
    assert sent.headers["Authorization"] == f"Key {KEY}"
    assert sent.json() == {
        "prompt": "a lamp",
        "image_size": {"width": 1536, "height": 1024},
        "num_images": 2,
        "max_images": 1,
        "seed": 7,
        "enable_safety_checker": True,
    }
    assert len(done["works"]) == 2
    for work in done["works"]:
        media = await client.get(work["media_url"])
        assert media.status == 200
        assert (await media.read()).startswith(b"\x89PNG")
    await assert_books(client, 12, refunded=False)


async def test_a_video_model_runs_on_fal_and_its_clip_is_stored(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """Kling: seconds, shape and negative prompt as fal takes them; an MP4 work."""
    async with running_worker(redis, settings):
        generation = await submit(
            client, model="kling-2-1", prompt="waves", size="720x1280",
            negative_prompt="blur",
        )  # fmt: skip
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    (sent,) = submits(fake)
    assert sent.path == "/" + KLING
    assert sent.json() == {
        "prompt": "waves",
        "duration": "5",
        "aspect_ratio": "9:16",
        "negative_prompt": "blur",
    }
    (work,) = done["works"]
    assert work["kind"] == "video"
    assert work["content_type"] == "video/mp4"
    assert work["duration"] > 0
    await assert_books(client, 120, refunded=False)


async def test_a_reference_image_goes_to_the_edit_endpoint_as_a_data_uri(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """Seedream with a reference: the edit endpoint, the upload's bytes inline."""
    image = png(80, 60, "orange")
    form = FormData()
    form.add_field("file", image, filename="ref.png", content_type="image/png")
    upload = await (await client.post("/api/uploads", data=form)).json()
    async with running_worker(redis, settings):
        generation = await submit(
            client, model="seedream-4", prompt="same, in blue", reference=upload["id"]
        )
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    (sent,) = submits(fake)
    assert sent.path == "/fal-ai/bytedance/seedream/v4/edit"
    (uri,) = sent.json()["image_urls"]
    header, _, data = uri.partition(",")
    assert header == "data:image/png;base64"
    assert base64.b64decode(data) == image


async def test_progress_from_the_runners_logs_is_passed_through(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """IN_PROGRESS at "50%" shows as progress; it never goes back; 1.0 at the end."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedream-4", prompt="a lamp")
        seen = 0.0
        deadline = time.monotonic() + 20
        while seen < 0.5 and time.monotonic() < deadline:
            body = await (
                await client.get(f"/api/generations/{generation['id']}")
            ).json()
            assert body["progress"] >= seen
            seen = body["progress"]
            await asyncio.sleep(0.05)
        assert 0.5 <= seen < 1.0
        assert body["status"] == "running"
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded"
    assert done["progress"] == 1.0


async def test_a_canceled_generation_cancels_its_fal_request_and_refunds_once(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """Cancel while fal runs it: the PUT …/cancel reaches fal; one refund."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedream-4", prompt="a lamp")
        await wait_for_status(client, generation["id"], {"running"}, 20)
        await until(lambda: any(job.polls >= 2 for job in fake.jobs.values()))
        response = await client.post(f"/api/generations/{generation['id']}/cancel")
        assert response.status == 200
        await until(lambda: bool(fake.canceled()))
    assert fake.canceled() == list(fake.jobs)
    (rid,) = fake.jobs
    (put,) = [r for r in fake.requests if r.method == "PUT"]
    assert put.path == f"/fal-ai/bytedance/requests/{rid}/cancel"
    assert put.headers["Authorization"] == f"Key {KEY}"
    body = await (await client.get(f"/api/generations/{generation['id']}")).json()
    assert (body["status"], body["refunded"]) == ("canceled", True)
    await assert_books(client, 6, refunded=True)


@pytest.mark.parametrize(
    "fault",
    [
        Canned(503, {"detail": "Service Unavailable"}),
        Canned(
            500, "<html>Internal Server Error</html>", {"Content-Type": "text/html"}
        ),
        Canned(drop=True),
    ],
    ids=["503", "500", "dropped"],
)
async def test_a_busy_or_broken_submit_is_retried_and_charged_once(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis, fault: Canned
) -> None:
    """A 5xx or a dropped connection at submit: tried again, then it succeeds."""
    fake.script(fault)
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a lamp")
        )
    assert done["status"] == "succeeded", done
    assert len(submits(fake)) == 2
    await assert_books(client, 6, refunded=False)


async def test_a_429_at_submit_waits_out_its_retry_after(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """429 with Retry-After: 2 → the next submit comes no sooner than 2 s later."""
    fake.script(Canned(429, {"detail": "Too many requests"}, {"Retry-After": "2"}))
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a lamp")
        )
    assert done["status"] == "succeeded", done
    first, second = submits(fake)
    times = [r.at for r in (first, second)]
    assert times[1] - times[0] >= 1.9
    await assert_books(client, 6, refunded=False)


async def test_a_busy_status_poll_is_retried_without_a_second_request(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """5xx and 429 while polling: polled again; fal ran (and billed) one request."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedream-4", prompt="a lamp")
        await until(lambda: bool(fake.jobs))
        fake.script(
            Canned(502, "Bad Gateway", {"Content-Type": "text/plain"}),
            Canned(429, {"detail": "slow down"}, {"Retry-After": "0"}),
        )
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert len(submits(fake)) == 1
    await assert_books(client, 6, refunded=False)


@pytest.mark.parametrize("in_status", [True, False], ids=["status", "result"])
async def test_a_content_policy_refusal_fails_content_blocked_with_one_refund(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis, in_status: bool
) -> None:
    """fal's 422 content_policy_violation (in the status or the result): no retry."""
    fake.refusal = (422, FAL_ERRORS["content_policy_violation"])
    fake.refusal_in_status = in_status
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a forbidden thing")
        )
    assert (done["status"], done["error"], done["refunded"]) == (
        "failed", "CONTENT_BLOCKED", True,
    )  # fmt: skip
    assert len(submits(fake)) == 1
    await assert_books(client, 6, refunded=True)


async def test_flagged_images_fail_content_blocked(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """A result whose images are flagged `has_nsfw_concepts` is not delivered."""
    url = fake.serve("black.png", png(), "image/png")
    fake.result = {"images": [{"url": url}], "has_nsfw_concepts": [True]}
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="flux-kontext-pro", prompt="a lamp")
        )
    assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
    await assert_books(client, 8, refunded=True)


@pytest.mark.parametrize(
    "where",
    ["submit-401", "submit-422", "result-422", "result-404"],
)
async def test_another_refusal_fails_upstream_failed_at_once(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis, where: str
) -> None:
    """A wrong key, an invalid input, a lost request: UPSTREAM_FAILED, never retried."""
    if where == "submit-401":
        fake.key = "another key"
    elif where == "submit-422":
        fake.script(Canned(422, FAL_ERRORS["invalid"]))
    elif where == "result-422":
        fake.refusal = (422, FAL_ERRORS["invalid"])
    else:
        fake.refusal = (404, {"detail": "Request not found"})
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a lamp")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(submits(fake)) == 1
    await assert_books(client, 6, refunded=True)


@pytest.mark.parametrize(
    "answer",
    [
        "html-submit",
        "no-request-id",
        "unknown-status",
        "images-not-a-list",
        "too-few-images",
        "html-image",
    ],
)
async def test_a_malformed_answer_fails_the_generation_cleanly(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis, answer: str
) -> None:
    """HTML for JSON, missing fields, fewer images than paid for: failed, refunded."""
    if answer == "html-submit":
        fake.script(Canned(200, "<html>hello</html>", {"Content-Type": "text/html"}))
    elif answer == "no-request-id":
        fake.script(Canned(200, {"status": "IN_QUEUE"}))
    elif answer == "unknown-status":
        fake.script(
            Canned(200, {"request_id": "r-1", "status": "IN_QUEUE"}),
            Canned(200, {"status": "EXPLODED"}),
        )
    elif answer == "images-not-a-list":
        fake.result = {"images": "https://example.com/a.png"}
    elif answer == "too-few-images":
        fake.result = {"images": [{"url": fake.serve("one.png", png(), "image/png")}]}
    else:
        page = fake.serve("page.html", b"<html><script>x</script></html>", "text/html")
        fake.result = {"images": [{"url": page}, {"url": page}]}
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a lamp", count=2)
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(submits(fake)) == 1
    await assert_books(client, 12, refunded=True)


@pytest.mark.parametrize("result", ["two-gigabytes", "private-address", "redirected"])
async def test_an_oversized_or_private_result_is_never_stored(
    client: Client,
    fake: FakeFal,
    settings: Settings,
    redis: Redis,
    tmp_path: Path,
    result: str,
) -> None:
    """A 2 GB "image", a URL on another private address (or redirected there)."""
    private = fake.url_at("localhost", "/files/" + "x.png")
    fake.serve("x.png", png(), "image/png")
    url = {
        "two-gigabytes": f"{fake.base_url}/huge/a.png",
        "private-address": private,
        "redirected": fake.redirect_to(private),
    }[result]
    fake.result = {"images": [{"url": url}]}
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="a lamp")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert not list((tmp_path / "media").rglob("*.png"))
    await assert_books(client, 6, refunded=True)


async def test_fields_the_model_cannot_take_are_refused_before_charging(
    client: Client,
) -> None:
    """Seedream and Kontext on fal take no negative prompt: 400 naming it, no debit."""
    for model in ("seedream-4", "flux-kontext-pro"):
        response = await client.post(
            "/api/generations",
            json={"model": model, "prompt": "a lamp", "negative_prompt": "blur"},
        )
        assert response.status == 400
        assert await response.json() == {
            "error": "BAD_REQUEST",
            "field": "negative_prompt",
        }
    assert await balance(client) == 1000


async def test_the_key_reaches_no_log_and_no_answer(
    client: Client,
    fake: FakeFal,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faults of every kind are logged and answered without the key."""
    fake.script(Canned(503), Canned(429, headers={"Retry-After": "0"}))
    fake.refusal = (401, {"detail": f"Invalid key {KEY}"})
    caplog.set_level(logging.DEBUG)
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedream-4", prompt="a lamp")
        done = await finished(client, generation)
    assert done["error"] == "UPSTREAM_FAILED"
    answers = [
        await (await client.get(path)).text()
        for path in (f"/api/generations/{generation['id']}", "/api/models")
    ]
    assert KEY not in caplog.text
    assert all(KEY not in answer for answer in answers)
    adapter = fal.upstream(settings.workbench.upstreams["fal"])
    assert KEY not in repr(settings) + repr(adapter)
    await adapter.aclose()


def _request(model_id: str, **changes: Any) -> Request:
    model = next(m for m in load_content().models if m.id == model_id)
    width, _, height = model.sizes[0].partition("x")
    fields: dict[str, Any] = {
        "model": model.id,
        "upstream_model": model.upstream_model,
        "kind": model.kind,
        "prompt": "p",
        "negative_prompt": "",
        "width": int(width),
        "height": int(height),
        "count": 1,
        "seed": 1,
        "seconds": float(model.seconds) if model.seconds else None,
        "reference": None,
    }
    return Request(**{**fields, **changes})


def test_every_catalog_row_on_fal_maps_to_an_endpoint_that_takes_it() -> None:
    """Each fal row's model is known, its seconds offered, each size a shape it has."""
    rows = [m for m in load_content().models if m.upstream == "fal"]
    assert {m.upstream_model for m in rows} <= set(fal.MODELS)
    for model in rows:
        for size in model.sizes:
            width, _, height = size.partition("x")
            endpoint, body = fal.request_of(
                _request(model.id, width=int(width), height=int(height))
            )
            assert endpoint == model.upstream_model
            assert body["prompt"] == "p"
        if model.accepts_reference:
            endpoint, body = fal.request_of(_request(model.id, reference=png()))
            assert endpoint == fal.MODELS[model.upstream_model].with_reference


def test_refusals_and_progress_are_read_from_vendor_text_narrowly() -> None:
    """Safety words mean CONTENT_BLOCKED, an invalid safety_* field does not."""
    assert says_blocked(REPLICATE_SENSITIVE)
    assert says_blocked({"detail": "NSFW content detected in the output"})
    assert not says_blocked("- input.safety_tolerance: must be less than or equal to 6")
    assert not says_blocked(FAL_ERRORS["invalid"])
    assert fal.blocked(FAL_ERRORS["content_policy_violation"])
    assert not fal.blocked(FAL_ERRORS["invalid"])
    assert log_fraction(["Loading", "Generating: 50%|#####     | 14/28"]) == 0.5
    assert log_fraction(["step 3/4 done"]) == 0.75
    assert log_fraction(["started 2026/11/23"]) is None
    assert log_fraction([]) is None


async def test_a_worker_sigkilled_while_polling_leaves_the_request_to_the_next(
    client: Client, fake: FakeFal, env: dict[str, str]
) -> None:
    """The queued request's URLs are kept with the job: polled, never resubmitted."""
    fake.hold = True
    with worker_process(env) as first:
        generation = await submit(client, model="seedream-4", prompt="a slow lamp")
        await until(lambda: any(job.polls >= 2 for job in fake.jobs.values()))
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    fake.hold = False
    with worker_process(env):
        done = await finished(client, generation, within=60)
    assert done["status"] == "succeeded", done
    assert len(submits(fake)) == 1
    await assert_books(client, 6, refunded=False)
