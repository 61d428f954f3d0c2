"""The `ark` protocol against a fake Volcengine Ark on loopback, through workers."""

from __future__ import annotations

import asyncio
import base64
import logging
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import FormData
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.upstreams import ark
from service.studio.upstreams.registry import Upstreams

from .conftest import Client, SettingsFactory
from .upstream_fakes import Canned, png
from .upstream_jobs import (
    assert_books,
    finished,
    running_worker,
    submit,
    until,
    upstream_env,
)
from .vendor_fakes import FakeArk, ark_error
from .vendor_jobs import canceled_while_queued, sigkilled_while_polling
from .workbench import sign_in, worker_process

KEY = "ark-test-key-7f3e2d1c-0b9a-4c8d-a1b2-c3d4e5f6a7b8"
IMAGES = "/api/v3/images/generations"
TASKS = "/api/v3/contents/generations/tasks"
SEEDREAM, SEEDANCE = ("seedream-5", 5), ("seedance-2", 80)


@pytest.fixture
async def fake() -> AsyncIterator[FakeArk]:
    """Ark on loopback, knowing our key."""
    async with FakeArk(KEY) as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, redis_server: RedisServer, fake: FakeArk) -> dict[str, str]:
    """Settings of the app and its workers: the `ark` upstream is the fake."""
    return upstream_env(tmp_path, redis_server.url, "ark", fake.base_url, KEY)


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


async def test_seedream_answers_base64_images_at_once_one_call_per_image(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis
) -> None:
    """Two images: two synchronous calls in Ark's shape, two PNGs stored, no task."""
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(
                client, model="seedream-5", prompt="一盏台灯", size="2560x1440",
                count=2, seed=7,
            ),
        )  # fmt: skip
    assert done["status"] == "succeeded", done
    sent = fake.api_requests(IMAGES)
    assert len(sent) == 2
    assert fake.creates == 0
    assert sent[0].headers["Authorization"] == f"Bearer {KEY}"
    assert sent[0].json() == {
        "model": "doubao-seedream-5-0-260128",
        "prompt": "一盏台灯",
        "size": "2560x1440",
        "seed": 7,
        "response_format": "b64_json",
        "sequential_image_generation": "disabled",
        "watermark": False,
    }
    assert [w["content_type"] for w in done["works"]] == ["image/png"] * 2
    media = await client.get(done["works"][0]["media_url"])
    assert (await media.read()).startswith(b"\x89PNG")
    await assert_books(client, 10, refunded=False)


async def test_a_seedream_answer_may_take_twice_the_upstreams_timeout(
    make_settings: SettingsFactory,
    env: dict[str, str],
    mail_server: MailCatcher,
    redis: Redis,
    aiohttp_client: AiohttpClient,
    fake: FakeArk,
) -> None:
    """A synchronous image call waits twice `timeout` for its answer (the images
    come in it): one call at 1 s, answered after 1.5 s, is kept, not sent again."""
    settings = make_settings(**env, STUDIO_UPSTREAMS_ARK_TIMEOUT="1")
    client = await aiohttp_client(create_app(settings))
    await sign_in(client, mail_server)
    image = base64.b64encode(png(32, 32)).decode()
    answer = {
        "model": "doubao-seedream-5-0-260128",
        "created": 1764057600,
        "data": [{"b64_json": image, "size": "2048x2048"}],
        "error": None,
    }
    fake.script(Canned(200, answer, delay=1.5))  # fmt: skip
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-5", prompt="一盏台灯")
        )
    assert done["status"] == "succeeded", done
    assert len(fake.api_requests(IMAGES)) == 1
    await assert_books(client, 5, refunded=False)


async def test_a_reference_goes_to_seedream_as_a_data_uri(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis
) -> None:
    """`image` carries the upload, as the SDK sends it."""
    image = png(80, 80, "navy")
    form = FormData()
    form.add_field("file", image, filename="ref.png", content_type="image/png")
    upload = await (await client.post("/api/uploads", data=form)).json()
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(
                client, model="seedream-5", prompt="红色", reference=upload["id"]
            ),
        )
    assert done["status"] == "succeeded", done
    (sent,) = fake.api_requests(IMAGES)
    header, _, data = sent.json()["image"].partition(",")
    assert (header, base64.b64decode(data)) == ("data:image/png;base64", image)


async def test_seedance_runs_as_a_task_polled_to_a_stored_clip(
    client: Client, fake: FakeArk, env: dict[str, str]
) -> None:
    """Create (content[], ratio, duration), queued → running → succeeded, an MP4."""
    fake.hold = True
    with worker_process(env):
        generation = await submit(client, model="seedance-2", prompt="海边的灯塔")
        seen = 0.0
        while seen <= 0.05:
            body = await (
                await client.get(f"/api/generations/{generation['id']}")
            ).json()
            seen = body["progress"]
            await asyncio.sleep(0.02)
        assert body["status"] == "running"
        assert 0.05 < seen < 1.0
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0
    (created,) = fake.api_requests(TASKS)
    assert created.json() == {
        "model": "doubao-seedance-2-0-260128",
        "content": [{"type": "text", "text": "海边的灯塔"}],
        "resolution": "720p",
        "ratio": "16:9",
        "duration": 5,
        "seed": done["seed"] % 2**31,  # our seed's low 31 bits: Ark's is an int32
        "watermark": False,
    }
    (work,) = done["works"]
    media = await client.get(work["media_url"])
    assert (await media.read())[4:8] == b"ftyp"
    await assert_books(client, 80, refunded=False)


@pytest.mark.parametrize(
    "code",
    [
        "InputTextSensitiveContentDetected",
        "InputImageSensitiveContentDetected.PrivacyInformation",
        "OutputImageSensitiveContentDetected.PolicyViolation",
        "InputImageRiskDetection",
    ],
)
async def test_seedream_moderation_codes_fail_content_blocked_refunded_once(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis, code: str
) -> None:
    """A 400 moderation code: CONTENT_BLOCKED at once, not retried, one refund."""
    fake.image_failure = code
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-5", prompt="something")
        )
    assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
    assert len(fake.api_requests(IMAGES)) == 1
    await assert_books(client, 5, refunded=True)


@pytest.mark.parametrize(
    "code",
    [
        "OutputVideoSensitiveContentDetected",
        "OutputVideoSensitiveContentDetected.PolicyViolation",
        "InputTextSensitiveContentDetected",
    ],
)
async def test_a_seedance_task_failed_by_moderation_is_content_blocked(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis, code: str
) -> None:
    """Seedance refuses as a failed task: CONTENT_BLOCKED, one task, one refund."""
    fake.failure = code
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedance-2", prompt="something")
        )
    assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
    assert fake.creates == 1
    await assert_books(client, 80, refunded=True)


@pytest.mark.parametrize(
    "answer",
    [
        Canned(429, ark_error("RateLimitExceeded.EndpointRPMExceeded"),
               {"Retry-After": "0"}),
        Canned(429, ark_error("ModelAccountIpmRateLimitExceeded")),
        Canned(500, ark_error("InternalServiceError", kind="InternalServerError")),
    ],
    ids=["rpm", "ipm", "500"],
)  # fmt: skip
async def test_rate_limits_and_server_faults_are_retried_and_charged_once(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis, answer: Canned
) -> None:
    """A 429 of the rate family or a 500: retried within the deadline, succeeds."""
    fake.script(answer)
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedance-2", prompt="a lamp")
        )
    assert done["status"] == "succeeded", done
    assert len(fake.api_requests(TASKS)) == 2
    assert fake.creates == 1
    await assert_books(client, 80, refunded=False)


async def test_a_busy_poll_is_retried_on_the_same_task(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis
) -> None:
    """429 and 503 while polling: polled again, never created again."""
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedance-2", prompt="a lamp")
        fake.hold = True
        await until(lambda: bool(fake.tasks))
        fake.script(
            Canned(429, ark_error("RequestBurstTooFast"), {"Retry-After": "0"}),
            Canned(503, "Service Unavailable", {"Content-Type": "text/plain"}),
        )
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert fake.creates == 1
    await assert_books(client, 80, refunded=False)


@pytest.mark.parametrize(
    ("model", "answer"),
    [
        (SEEDREAM, Canned(200, "<html>ok</html>", {"Content-Type": "text/html"})),
        (SEEDREAM, Canned(200, {"data": [{"b64_json": "bm90IGFuIGltYWdl"}]})),
        (SEEDANCE, Canned(200, {"status": "queued"})),
        (SEEDANCE, Canned(400, ark_error("InvalidParameter.UnsupportedParameter"))),
        (SEEDANCE, Canned(401, ark_error("AuthenticationError", kind="Unauthorized"))),
    ],
    ids=["html", "not-an-image", "no-task-id", "invalid", "unauthorized"],
)
async def test_a_bad_answer_or_refusal_fails_upstream_failed_refunded_once(
    client: Client,
    fake: FakeArk,
    settings: Settings,
    redis: Redis,
    model: tuple[str, int],
    answer: Canned,
) -> None:
    """An unreadable answer or a 4xx refusal: UPSTREAM_FAILED at once, one refund."""
    fake.script(answer)
    async with running_worker(redis, settings):
        done = await finished(client, await submit(client, model=model[0], prompt="p"))
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(fake.requests) == 1  # not retried
    await assert_books(client, model[1], refunded=True)


@pytest.mark.parametrize("ending", ["expired", "cancelled"])
async def test_an_expired_or_foreign_cancelled_task_fails_and_refunds(
    client: Client, fake: FakeArk, settings: Settings, redis: Redis, ending: str
) -> None:
    """A task that ended without a result: UPSTREAM_FAILED, one refund."""
    fake.ending = ending
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedance-2", prompt="a lamp")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    await assert_books(client, 80, refunded=True)


async def test_a_canceled_generation_deletes_its_queued_task(
    client: Client, fake: FakeArk, env: dict[str, str]
) -> None:
    """Cancel while Ark queues it: DELETE …/tasks/{id} with the key; one refund."""
    await canceled_while_queued(client, fake, env, "seedance-2", 80)
    (deleted,) = [r for r in fake.requests if r.method == "DELETE"]
    assert deleted.path == f"{TASKS}/{next(iter(fake.tasks))}"
    assert deleted.headers["Authorization"] == f"Bearer {KEY}"


async def test_a_worker_sigkilled_while_polling_leaves_the_task_to_the_next(
    client: Client, fake: FakeArk, env: dict[str, str], redis: Redis
) -> None:
    """The task id is kept with the job: the next worker polls it, never re-creates."""
    await sigkilled_while_polling(client, fake, env, redis, "seedance-2", 80)


async def test_the_key_reaches_no_log_no_answer_and_no_repr(
    client: Client,
    fake: FakeArk,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faults of every kind are logged and answered without the key."""
    fake.script(
        Canned(503), Canned(401, ark_error("AuthenticationError", f"bad key {KEY}"))
    )
    caplog.set_level(logging.DEBUG)
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedance-2", prompt="a lamp")
        done = await finished(client, generation)
    assert done["error"] == "UPSTREAM_FAILED"
    answers = [
        await (await client.get(path)).text()
        for path in (f"/api/generations/{generation['id']}", "/api/models")
    ]
    assert KEY not in caplog.text
    assert all(KEY not in answer for answer in answers)
    upstreams = Upstreams(settings.workbench)
    adapter = ark.upstream(settings.workbench.upstreams["ark"])
    assert KEY not in repr(settings) + repr(adapter) + repr(adapter.api.__dict__)
    await adapter.aclose()
    await upstreams.aclose()


async def test_a_worker_stopped_by_sigterm_hands_the_task_on_without_cancelling(
    client: Client, fake: FakeArk, env: dict[str, str]
) -> None:
    """SIGTERM past the grace period: the job goes back, the task is not deleted."""
    fake.queued = True
    with worker_process(env) as first:
        generation = await submit(client, model="seedance-2", prompt="slow")
        await until(lambda: any(task.polls >= 2 for task in fake.tasks.values()))
        first.send_signal(signal.SIGTERM)
        await asyncio.to_thread(first.wait, 30)
    assert not [r for r in fake.requests if r.method == "DELETE"]
    fake.queued = False
    with worker_process(env):
        done = await finished(client, generation, within=60)
    assert done["status"] == "succeeded", done
    assert fake.creates == 1
    await assert_books(client, 80, refunded=False)
