"""The `replicate` protocol against fake predictions on loopback, through the worker."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import FormData
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.content import Content, load_content
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.upstreams import replicate
from service.studio.upstreams.base import Request

from .conftest import Client, SettingsFactory
from .upstream_fakes import (
    REPLICATE_ERRORS,
    REPLICATE_SENSITIVE,
    Canned,
    FakeReplicate,
    png,
)
from .upstream_jobs import (
    assert_books,
    finished,
    running_worker,
    submit,
    until,
    upstream_env,
)
from .workbench import balance, sign_in, wait_for_status, worker_process

KEY = "r8_test_key_0a1b2c3d4e5f60718293a4b5c6d7"
HAILUO = "/v1/models/minimax/hailuo-02/predictions"
KONTEXT = "/v1/models/black-forest-labs/flux-kontext-pro/predictions"


@pytest.fixture
async def fake() -> AsyncIterator[FakeReplicate]:
    """Replicate's predictions on loopback, knowing our key."""
    async with FakeReplicate(KEY) as server:
        yield server


@pytest.fixture
def env(
    tmp_path: Path, redis_server: RedisServer, fake: FakeReplicate
) -> dict[str, str]:
    """Settings of the app and its workers: the `replicate` upstream is the fake.

    `fal` gets a key too, so the app offers FLUX.1 Kontext; the image tests
    run it on a worker whose catalog routes it to Replicate instead (as an
    operator could), since the catalog's only Replicate model is a video one.
    """
    return {
        **upstream_env(tmp_path, redis_server.url, "replicate", fake.base_url, KEY),
        "STUDIO_UPSTREAMS_FAL_BASE_URL": fake.base_url,
        "STUDIO_UPSTREAMS_FAL_API_KEY": "unused",
    }


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


def kontext_on_replicate() -> Content:
    """The catalog with FLUX.1 Kontext [pro] routed to Replicate's official model."""
    content = load_content()
    models = tuple(
        dataclasses.replace(
            model,
            upstream="replicate",
            upstream_model="black-forest-labs/flux-kontext-pro",
        )
        if model.id == "flux-kontext-pro"
        else model
        for model in content.models
    )
    return dataclasses.replace(content, models=models)


def creates(fake: FakeReplicate) -> list[Any]:
    """The create requests the fake received."""
    return [r for r in fake.requests if r.path in (HAILUO, KONTEXT)]


async def test_a_video_model_runs_on_replicate_from_submit_to_a_stored_clip(
    client: Client, fake: FakeReplicate, env: dict[str, str]
) -> None:
    """Hailuo 02: polled (no Prefer: wait), seconds and tier in its fields; an MP4."""
    with worker_process(env):
        done = await finished(
            client, await submit(client, model="hailuo-02", prompt="a product spin")
        )
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0
    (sent,) = creates(fake)
    assert sent.path == HAILUO
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert "Prefer" not in sent.headers
    assert sent.json() == {
        "input": {"prompt": "a product spin", "duration": 6, "resolution": "768p"}
    }
    (work,) = done["works"]
    assert (work["kind"], work["content_type"]) == ("video", "video/mp4")
    media = await client.get(work["media_url"])
    assert (await media.read())[4:8] == b"ftyp"
    await assert_books(client, 100, refunded=False)


async def test_an_image_model_answers_at_once_with_prefer_wait(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """An image asks `Prefer: wait`: the finished prediction comes back, no polls."""
    async with running_worker(redis, settings, kontext_on_replicate()):
        done = await finished(
            client,
            await submit(
                client, model="flux-kontext-pro", prompt="a lamp", size="768x1344",
                seed=9,
            ),
        )  # fmt: skip
    assert done["status"] == "succeeded", done
    (sent,) = creates(fake)
    assert sent.path == KONTEXT
    assert sent.headers["Prefer"] == "wait=30"
    assert sent.json() == {
        "input": {
            "prompt": "a lamp",
            "aspect_ratio": "9:16",
            "seed": 9,
            "output_format": "png",
            "safety_tolerance": 2,
        }
    }
    assert not [r for r in fake.requests if r.method == "GET"]
    (work,) = done["works"]
    assert work["content_type"] == "image/png"
    await assert_books(client, 8, refunded=False)


async def test_a_reference_image_becomes_the_first_frame_as_a_data_uri(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """Hailuo with a reference: first_frame_image carries the upload; 9:16 allowed."""
    image = png(72, 128, "navy")
    form = FormData()
    form.add_field("file", image, filename="ref.png", content_type="image/png")
    upload = await (await client.post("/api/uploads", data=form)).json()
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(
                client, model="hailuo-02", prompt="turns around", size="720x1280",
                reference=upload["id"],
            ),
        )  # fmt: skip
    assert done["status"] == "succeeded", done
    (sent,) = creates(fake)
    header, _, data = sent.json()["input"]["first_frame_image"].partition(",")
    assert header == "data:image/png;base64"
    assert base64.b64decode(data) == image


async def test_progress_from_the_prediction_logs_is_passed_through(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """processing at "50%" shows as progress; succeeded ends at 1.0."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="hailuo-02", prompt="a spin")
        seen = 0.0
        for _ in range(400):
            body = await (
                await client.get(f"/api/generations/{generation['id']}")
            ).json()
            assert body["progress"] >= seen
            seen = body["progress"]
            if seen >= 0.5:
                break
            await asyncio.sleep(0.05)
        assert 0.5 <= seen < 1.0
        assert body["status"] == "running"
        fake.hold = False
        done = await finished(client, generation)
    assert (done["status"], done["progress"]) == ("succeeded", 1.0)


async def test_a_canceled_generation_cancels_its_prediction_and_refunds_once(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """Cancel while it runs: POST /v1/predictions/{id}/cancel reaches Replicate."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="hailuo-02", prompt="a spin")
        await wait_for_status(client, generation["id"], {"running"}, 20)
        await until(lambda: any(n >= 1 for n in fake.polls.values()))
        response = await client.post(f"/api/generations/{generation['id']}/cancel")
        assert response.status == 200
        await until(lambda: bool(fake.canceled()))
    (pid,) = fake.predictions
    assert fake.canceled() == [pid]
    (cancel,) = [r for r in fake.requests if r.path.endswith("/cancel")]
    assert cancel.path == f"/v1/predictions/{pid}/cancel"
    assert cancel.headers["Authorization"] == f"Bearer {KEY}"
    await assert_books(client, 100, refunded=True)


@pytest.mark.parametrize(
    "fault",
    [
        Canned(503, {"detail": "Service Unavailable", "status": 503}),
        Canned(
            500, "<html>Internal Server Error</html>", {"Content-Type": "text/html"}
        ),
        Canned(drop=True),
    ],
    ids=["503", "500", "dropped"],
)
async def test_a_busy_or_broken_create_is_retried_and_charged_once(
    client: Client,
    fake: FakeReplicate,
    settings: Settings,
    redis: Redis,
    fault: Canned,
) -> None:
    """A 5xx or a dropped connection at create: tried again, then it succeeds."""
    fake.script(fault)
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="hailuo-02", prompt="a spin")
        )
    assert done["status"] == "succeeded", done
    assert len(creates(fake)) == 2
    await assert_books(client, 100, refunded=False)


async def test_a_429_at_create_waits_out_its_retry_after(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """Replicate's throttle with Retry-After: 2 → the next create 2 s later."""
    fake.script(Canned(429, REPLICATE_ERRORS["throttled"], {"Retry-After": "2"}))
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="hailuo-02", prompt="a spin")
        )
    assert done["status"] == "succeeded", done
    first, second = creates(fake)
    assert second.at - first.at >= 1.9
    await assert_books(client, 100, refunded=False)


async def test_a_busy_poll_is_retried_without_a_second_prediction(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis
) -> None:
    """5xx and 429 while polling: polled again; Replicate ran one prediction."""
    fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="hailuo-02", prompt="a spin")
        await until(lambda: bool(fake.predictions))
        fake.script(
            Canned(502, "Bad Gateway", {"Content-Type": "text/plain"}),
            Canned(429, REPLICATE_ERRORS["throttled"], {"Retry-After": "0"}),
        )
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert len(creates(fake)) == 1
    await assert_books(client, 100, refunded=False)


@pytest.mark.parametrize("where", ["prediction", "create"])
async def test_a_content_refusal_fails_content_blocked_with_one_refund(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis, where: str
) -> None:
    """A failed prediction "flagged as sensitive (E005)", or a 422 saying so."""
    if where == "prediction":
        fake.failure = REPLICATE_SENSITIVE
    else:
        fake.script(Canned(422, REPLICATE_ERRORS["sensitive"]))
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="hailuo-02", prompt="a forbidden thing")
        )
    assert (done["status"], done["error"], done["refunded"]) == (
        "failed", "CONTENT_BLOCKED", True,
    )  # fmt: skip
    assert len(creates(fake)) == 1
    await assert_books(client, 100, refunded=True)


@pytest.mark.parametrize("where", ["create-401", "create-422", "failed", "canceled"])
async def test_another_refusal_fails_upstream_failed_at_once(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis, where: str
) -> None:
    """A wrong key, invalid input, a model error, a cancel by someone else."""
    if where == "create-401":
        fake.key = "another key"
    elif where == "create-422":
        fake.script(Canned(422, REPLICATE_ERRORS["invalid"]))
    elif where == "failed":
        fake.failure = "CUDA out of memory (E1001)"
    else:
        fake.hold = True
    async with running_worker(redis, settings):
        generation = await submit(client, model="hailuo-02", prompt="a spin")
        if where == "canceled":
            await until(lambda: bool(fake.predictions))
            next(iter(fake.predictions.values()))["status"] = "canceled"
        done = await finished(client, generation)
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(creates(fake)) == 1
    await assert_books(client, 100, refunded=True)


@pytest.mark.parametrize(
    "answer", ["html-create", "no-id", "output-not-a-url", "no-output", "html-video"]
)
async def test_a_malformed_answer_fails_the_generation_cleanly(
    client: Client, fake: FakeReplicate, settings: Settings, redis: Redis, answer: str
) -> None:
    """HTML for JSON, missing fields, an HTML page for the clip: failed, refunded."""
    if answer == "html-create":
        fake.script(Canned(201, "<html>hello</html>", {"Content-Type": "text/html"}))
    elif answer == "no-id":
        fake.script(Canned(201, {"status": "starting"}))
    elif answer == "output-not-a-url":
        fake.output = {"video": 42}
    elif answer == "no-output":
        fake.output = []
    else:
        fake.output = fake.serve("page.html", b"<html>x</html>", "text/html")
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="hailuo-02", prompt="a spin")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(creates(fake)) == 1
    await assert_books(client, 100, refunded=True)


@pytest.mark.parametrize("result", ["two-gigabytes", "private-address", "redirected"])
async def test_an_oversized_or_private_result_is_never_stored(
    client: Client,
    fake: FakeReplicate,
    settings: Settings,
    redis: Redis,
    tmp_path: Path,
    result: str,
) -> None:
    """A 2 GB "image", a URL on another private address (or redirected there)."""
    fake.serve("x.png", png(), "image/png")
    private = fake.url_at("localhost", "/files/x.png")
    fake.output = {
        "two-gigabytes": f"{fake.base_url}/huge/a.png",
        "private-address": private,
        "redirected": fake.redirect_to(private),
    }[result]
    async with running_worker(redis, settings, kontext_on_replicate()):
        done = await finished(
            client, await submit(client, model="flux-kontext-pro", prompt="a lamp")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert not [p for p in (tmp_path / "media").rglob("*") if p.is_file()]
    await assert_books(client, 8, refunded=True)


async def test_fields_hailuo_cannot_take_are_refused_before_charging(
    client: Client,
) -> None:
    """No negative prompt; 9:16 only from a reference image: 400 naming the field."""
    for body, field in (
        ({"negative_prompt": "blur"}, "negative_prompt"),
        ({"size": "720x1280"}, "size"),
    ):
        response = await client.post(
            "/api/generations", json={"model": "hailuo-02", "prompt": "x", **body}
        )
        assert response.status == 400
        assert await response.json() == {"error": "BAD_REQUEST", "field": field}
    assert await balance(client) == 1000


def test_every_catalog_row_on_replicate_maps_to_a_model_that_takes_it() -> None:
    """Each Replicate row's model is known, its seconds offered; ids are owner/name."""
    rows = [m for m in load_content().models if m.upstream == "replicate"]
    assert rows
    for model in rows:
        assert model.upstream_model in replicate.MODELS
        width, _, height = model.sizes[0].partition("x")
        request = Request(
            model=model.id,
            upstream_model=model.upstream_model,
            kind=model.kind,
            prompt="p",
            negative_prompt="",
            width=int(width),
            height=int(height),
            count=1,
            seed=1,
            seconds=float(model.seconds) if model.seconds else None,
            reference=png() if model.accepts_reference else None,
        )
        path, body = replicate.request_of(request)
        assert path == f"/v1/models/{model.upstream_model}/predictions"
        assert body["input"]["prompt"] == "p"


def test_a_versioned_id_creates_through_v1_predictions() -> None:
    """`owner/name:version` runs that version through POST /v1/predictions."""
    version = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
    request = Request(
        model="x", upstream_model=f"someone/model:{version}", kind="image",
        prompt="p", negative_prompt="", width=1024, height=1024, count=2, seed=3,
        seconds=None, reference=None,
    )  # fmt: skip
    path, body = replicate.request_of(request)
    assert path == "/v1/predictions"
    assert body["version"] == version
    assert body["input"] == {
        "prompt": "p", "aspect_ratio": "1:1", "seed": 3, "num_outputs": 2,
    }  # fmt: skip


async def test_a_worker_sigkilled_while_polling_leaves_the_prediction_to_the_next(
    client: Client, fake: FakeReplicate, env: dict[str, str]
) -> None:
    """The prediction's id is kept with the job: polled again, never created again."""
    fake.hold = True
    with worker_process(env) as first:
        generation = await submit(client, model="hailuo-02", prompt="a slow spin")
        await until(lambda: any(n >= 2 for n in fake.polls.values()))
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    fake.hold = False
    with worker_process(env):
        done = await finished(client, generation, within=60)
    assert done["status"] == "succeeded", done
    assert len(creates(fake)) == 1
    await assert_books(client, 100, refunded=False)
