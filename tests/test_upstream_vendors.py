"""The task vendors (`dashscope`, `kling`, `minimax`) against fakes, through workers.

Every vendor passes the same cases, each with its own codes and shapes: a clip
stored with progress, each moderation code CONTENT_BLOCKED, rate and
concurrency codes retried, a bad answer UPSTREAM_FAILED, a failed or expired
task, cancel, a SIGKILLed worker; the ledger checked after each. Then what is
particular to each (DashScope's async header and Qwen-Image, Kling's JWT,
MiniMax's HTTP-200 errors and file retrieval).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import io
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import FormData
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.content import Content, load_content
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.upstreams import dashscope, kling, minimax
from service.studio.upstreams.tasks import TaskUpstream

from .conftest import Client, SettingsFactory
from .upstream_fakes import Canned, png
from .upstream_jobs import (
    TRIAL,
    assert_books,
    finished,
    running_worker,
    submit,
    until,
    upstream_env,
)
from .vendor_fakes import (
    FakeDashScope,
    FakeKling,
    FakeMiniMax,
    FakeTasks,
    dashscope_error,
    kling_error,
    minimax_answer,
)
from .vendor_jobs import canceled_while_queued, sigkilled_while_polling
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process

HTML = Canned(200, "<html>busy</html>", {"Content-Type": "text/html"})


@dataclass(frozen=True)
class Vendor:
    """One vendor's fake, key, video model and codes, for the shared cases."""

    name: str
    fake: type[FakeTasks]
    key: str
    model: str
    price: int
    adapter: Callable[..., TaskUpstream]
    # Moderation: answers to a create, and failed-task values (fake.failure).
    blocked_answers: tuple[Canned, ...]
    blocked_tasks: tuple[str, ...]
    # Rate and concurrency answers to a create: retried.
    busy: tuple[Canned, ...]
    # Refusals and unreadable answers to a create: UPSTREAM_FAILED at once.
    bad: tuple[Canned, ...]
    # A failed task that is no moderation.
    failed_task: str
    vendor_cancel: bool
    secret: str = field(default="")


VENDORS = [
    Vendor(
        "dashscope", FakeDashScope, "sk-ds-test-4f1e2d3c4b5a69788796a5b4", "wan-2-7",
        60, dashscope.upstream,
        blocked_answers=(
            Canned(400, dashscope_error("DataInspectionFailed", "Input or output"
                                        " data may contain inappropriate content.")),
            Canned(400, dashscope_error("IPInfringementSuspect")),
        ),
        blocked_tasks=("DataInspectionFailed",),
        busy=(
            Canned(429, dashscope_error("Throttling.RateQuota"), {"Retry-After": "0"}),
            Canned(429, dashscope_error("Throttling.BurstRate")),
            Canned(500, dashscope_error("InternalError")),
        ),
        bad=(
            HTML,
            Canned(200, {"output": {"task_status": "PENDING"}}),
            Canned(400, dashscope_error("InvalidParameter", "duration")),
            Canned(403, dashscope_error("Arrearage")),
        ),
        failed_task="InternalError.Algo",
        vendor_cancel=True,
    ),
    Vendor(
        "kling", FakeKling, "ak-test-0a1b2c3d:sk-test-9f8e7d6c5b4a39281706f5e4",
        "kling-3", 50, kling.upstream,
        blocked_answers=(
            Canned(400, kling_error(1301, "Trigger the content security policy")),
        ),
        blocked_tasks=("Failure to pass the risk control system",),
        busy=(
            Canned(429, kling_error(1302, "The API request is too fast")),
            Canned(429, kling_error(1303, "parallel task over resource pack limit")),
            Canned(503, kling_error(5001, "maintenance")),
        ),
        bad=(
            HTML,
            Canned(200, {"code": 0, "data": {"task_status": "submitted"}}),
            Canned(400, kling_error(1201, "invalid duration")),
            Canned(429, kling_error(1102, "resource pack depleted")),
        ),
        failed_task="internal error",
        vendor_cancel=False,
        secret="sk-test-9f8e7d6c5b4a39281706f5e4",
    ),
    Vendor(
        "minimax", FakeMiniMax, "mm-test-eyJhbGciOiJSUzI1NiJ9.0a1b2c3d4e5f",
        "hailuo-2-3", 40, minimax.upstream,
        blocked_answers=(Canned(200, minimax_answer(1026, "input sensitive")),),
        blocked_tasks=("1027",),
        busy=(
            Canned(200, minimax_answer(1002, "rate limit")),
            Canned(200, minimax_answer(1033, "downstream error")),
            Canned(502, "Bad Gateway", {"Content-Type": "text/plain"}),
        ),
        bad=(
            HTML,
            Canned(200, {"task_id": "t"}),
            Canned(200, minimax_answer(2013, "invalid params")),
            Canned(200, minimax_answer(1008, "insufficient balance")),
        ),
        # a failed task's code may be one a call would retry (1024: internal)
        failed_task="1024",
        vendor_cancel=False,
    ),
]  # fmt: skip


@pytest.fixture(params=VENDORS, ids=[vendor.name for vendor in VENDORS])
def vendor(request: pytest.FixtureRequest) -> Vendor:
    """Each task vendor in turn."""
    chosen: Vendor = request.param
    return chosen


@pytest.fixture
async def fake(vendor: Vendor) -> AsyncIterator[FakeTasks]:
    """The vendor's API on loopback, knowing our key."""
    async with vendor.fake(vendor.key) as server:
        yield server


@pytest.fixture
def env(
    tmp_path: Path, redis_server: RedisServer, vendor: Vendor, fake: FakeTasks
) -> dict[str, str]:
    """Settings of the app and its workers: the vendor's upstream is the fake."""
    return upstream_env(
        tmp_path, redis_server.url, vendor.name, fake.base_url, vendor.key
    )


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


async def test_a_clip_runs_as_a_task_with_progress_and_is_stored(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str]
) -> None:
    """Created once, running shows as progress, the MP4 is copied to our store."""
    fake.hold = True
    with worker_process(env):
        generation = await submit(client, model=vendor.model, prompt="海边的灯塔")
        await until(lambda: any(task.polls >= 2 for task in fake.tasks.values()))
        body = await (await client.get(f"/api/generations/{generation['id']}")).json()
        assert body["status"] == "running"
        assert 0.05 < body["progress"] < 1.0
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert done["progress"] == 1.0
    assert fake.creates == 1
    (work,) = done["works"]
    media = await client.get(work["media_url"])
    assert (await media.read())[4:8] == b"ftyp"
    assert not work["media_url"].startswith(fake.base_url)
    await assert_books(client, vendor.price, refunded=False)


def _blocked_cases(vendor: Vendor) -> list[tuple[Canned | None, str | None]]:
    return [(answer, None) for answer in vendor.blocked_answers] + [
        (None, failure) for failure in vendor.blocked_tasks
    ]


async def test_each_moderation_code_is_content_blocked_and_refunded_once(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str]
) -> None:
    """At create or as a failed task: CONTENT_BLOCKED, no retry, one refund each."""
    cases = _blocked_cases(vendor)
    with worker_process(env):
        for answer, failure in cases:
            if answer is not None:
                fake.script(answer)
            fake.failure = failure
            done = await finished(
                client, await submit(client, model=vendor.model, prompt="不该画的")
            )
            assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
            assert done["refunded"] is True
    assert fake.creates == len(vendor.blocked_tasks)
    await _assert_refunds(client, len(cases))


async def test_rate_and_concurrency_codes_are_retried_and_charged_once(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str]
) -> None:
    """Each busy answer at create, then one while polling: one task, no refund."""
    fake.script(*vendor.busy)
    with worker_process(env):
        generation = await submit(client, model=vendor.model, prompt="a lamp")
        done = await finished(client, generation, within=60)
        assert done["status"] == "succeeded", done
        fake.hold = True
        second = await submit(client, model=vendor.model, prompt="a lamp")
        await until(lambda: len(fake.tasks) == 2)
        fake.script(vendor.busy[0])
        fake.hold = False
        assert (await finished(client, second, within=60))["status"] == "succeeded"
    assert fake.creates == 2
    kinds = [e["kind"] for e in await ledger(client)]
    assert kinds == ["grant", "debit", "debit"]


@pytest.mark.parametrize("which", range(4))
async def test_a_bad_answer_or_refusal_fails_upstream_failed_refunded_once(
    client: Client,
    vendor: Vendor,
    fake: FakeTasks,
    settings: Settings,
    redis: Redis,
    which: int,
) -> None:
    """Unreadable, missing its task id, or a refusal: at once, not retried."""
    fake.script(vendor.bad[which])
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model=vendor.model, prompt="p")
        )
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert len(fake.requests) == 1
    await assert_books(client, vendor.price, refunded=True)


async def test_a_failed_or_expired_task_fails_and_refunds_once(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str]
) -> None:
    """A task that ends without a result: UPSTREAM_FAILED, one refund."""
    fake.failure = vendor.failed_task
    with worker_process(env):
        done = await finished(
            client, await submit(client, model=vendor.model, prompt="a lamp")
        )
        assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
        fake.failure, fake.ending = None, "expired"
        if vendor.name == "dashscope":  # UNKNOWN: gone after its 24 hours
            done = await finished(
                client, await submit(client, model=vendor.model, prompt="a lamp")
            )
            assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    await _assert_refunds(client, 2 if vendor.name == "dashscope" else 1)


async def test_cancel_uses_the_vendors_cancel_or_abandons_the_task(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str]
) -> None:
    """DashScope cancels a PENDING task; Kling and MiniMax have none: refunded once."""
    if vendor.vendor_cancel:
        await canceled_while_queued(client, fake, env, vendor.model, vendor.price)
        return
    fake.queued = True
    with worker_process(env):
        generation = await submit(client, model=vendor.model, prompt="never mind")
        await until(lambda: any(task.polls >= 2 for task in fake.tasks.values()))
        await client.post(f"/api/generations/{generation['id']}/cancel")
        body = await wait_for_status(client, generation["id"], {"canceled"})
        polls = sum(task.polls for task in fake.tasks.values())
        await asyncio.sleep(0.5)
    assert body["refunded"] is True
    assert fake.creates == 1
    assert sum(task.polls for task in fake.tasks.values()) <= polls + 1  # let go
    await assert_books(client, vendor.price, refunded=True)


async def test_a_worker_sigkilled_while_polling_leaves_the_task_to_the_next(
    client: Client, vendor: Vendor, fake: FakeTasks, env: dict[str, str], redis: Redis
) -> None:
    """The next worker polls the very task the first created: one create."""
    await sigkilled_while_polling(client, fake, env, redis, vendor.model, vendor.price)


async def test_the_key_reaches_no_log_no_answer_and_no_repr(
    client: Client,
    vendor: Vendor,
    fake: FakeTasks,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Faults logged and answered without the key (or Kling's secret half)."""
    fake.script(vendor.busy[-1], vendor.bad[2])
    caplog.set_level(logging.DEBUG)
    async with running_worker(redis, settings):
        generation = await submit(client, model=vendor.model, prompt="a lamp")
        await finished(client, generation)
    answers = [
        await (await client.get(path)).text()
        for path in (f"/api/generations/{generation['id']}", "/api/models")
    ]
    adapter = vendor.adapter(settings.workbench.upstreams[vendor.name])
    shown = caplog.text + "".join(answers) + repr(settings) + repr(adapter)
    shown += repr(vendor.adapter) + repr(vars(adapter.api))
    for secret in filter(None, (vendor.key, vendor.secret)):
        assert secret not in shown
    await adapter.aclose()


async def _assert_refunds(client: Client, count: int) -> None:
    """`count` jobs run one after another, each debited and refunded once."""
    kinds = [entry["kind"] for entry in await ledger(client)]
    assert kinds == ["grant"] + ["debit", "refund"] * count
    assert await balance(client) == TRIAL


# What is particular to each vendor.


async def _upload(
    client: Client, data: bytes, content_type: str = "image/png"
) -> dict[str, Any]:
    """Upload a reference image, as the workbench does."""
    form = FormData()
    form.add_field("file", data, filename="ref", content_type=content_type)
    response = await client.post("/api/uploads", data=form)
    assert response.status == 201, await response.text()
    body: dict[str, Any] = await response.json()
    return body


@pytest.mark.parametrize("vendor", [VENDORS[0]], ids=["dashscope"], indirect=True)
async def test_dashscope_tasks_are_created_with_the_async_header(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """X-DashScope-Async: enable and the wan2.7 body; a reference runs wan2.7-i2v."""
    image = png(64, 64, "navy")
    upload = await _upload(client, image)
    async with running_worker(redis, settings):
        first = await submit(
            client, model="wan-2-7", prompt="灯塔", negative_prompt="模糊", seed=3
        )
        second = await submit(
            client, model="wan-2-7", prompt="转身", reference=upload["id"]
        )
        for generation in (first, second):
            assert (await finished(client, generation))["status"] == "succeeded"
    plain, referenced = (r for r in fake.requests if r.method == "POST")
    assert plain.headers["X-DashScope-Async"] == "enable"
    assert plain.headers["Authorization"] == f"Bearer {VENDORS[0].key}"
    assert plain.json() == {
        "model": "wan2.7-t2v",
        "input": {"prompt": "灯塔", "negative_prompt": "模糊"},
        "parameters": {"resolution": "720P", "duration": 5, "prompt_extend": False,
                       "watermark": False, "seed": 3, "ratio": "16:9"},
    }  # fmt: skip
    sent = referenced.json()
    assert sent["model"] == "wan2.7-i2v"
    (media,) = sent["input"]["media"]
    assert media["type"] == "first_frame"
    assert base64.b64decode(media["url"].partition(",")[2]) == image


@pytest.mark.parametrize("vendor", [VENDORS[0]], ids=["dashscope"], indirect=True)
async def test_a_wan_prompt_is_refused_at_submit_past_the_800_characters_wan_takes(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """Over 800 characters (a preset's suffix counted) is a 400 before any charge;
    800 go through, with a seed past DashScope's int32 folded into it."""
    for body in (
        {"prompt": "浪" * 801},
        {"prompt": "浪" * 790, "preset": "photo"},
    ):
        response = await client.post(
            "/api/generations", json={"model": "wan-2-7", **body}
        )
        assert (response.status, await response.json()) == (
            400,
            {"error": "BAD_REQUEST", "field": "prompt"},
        )
    assert await balance(client) == TRIAL
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(client, model="wan-2-7", prompt="浪" * 800, seed=2**32 - 1),
        )
    assert done["status"] == "succeeded", done
    (sent,) = [r for r in fake.requests if r.method == "POST"]
    assert len(sent.json()["input"]["prompt"]) == 800
    assert sent.json()["parameters"]["seed"] == 2**31 - 1


@pytest.mark.parametrize("vendor", [VENDORS[0]], ids=["dashscope"], indirect=True)
async def test_qwen_image_answers_at_once_and_its_urls_are_copied(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """Synchronous: no task, no async header; n images fetched into our store."""
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(client, model="qwen-image-2-pro", prompt="海报", count=2,
                         size="1664x928", seed=3_000_000_005),
        )  # fmt: skip
    assert done["status"] == "succeeded", done
    assert done["seed"] == 3_000_000_005  # ours; DashScope takes 0..2**31-1
    (sent,) = [r for r in fake.requests if r.method == "POST"]
    assert "X-DashScope-Async" not in sent.headers
    assert sent.json()["parameters"] == {
        "size": "1664*928", "n": 2, "seed": 3_000_000_005 - 2**31,
        "prompt_extend": False, "watermark": False,
    }  # fmt: skip
    assert sent.json()["input"]["messages"][0]["content"] == [{"text": "海报"}]
    assert fake.creates == 0
    assert len(done["works"]) == 2
    await assert_books(client, 16, refunded=False)


@pytest.mark.parametrize("vendor", [VENDORS[1]], ids=["kling"], indirect=True)
async def test_every_kling_request_carries_a_fresh_hs256_jwt(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """iss = access key, exp = now + 30 min, nbf = now − 5 s; the secret never sent."""
    assert isinstance(fake, FakeKling)
    image = png(400, 320, "navy")  # Kling's own: a PNG at least 300 px a side
    upload = await _upload(client, image)
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(
                client, model="kling-3", prompt="转身", reference=upload["id"]
            ),
        )
    assert done["status"] == "succeeded", done
    assert len(fake.tokens) == len(fake.requests) >= 3
    for claims in fake.tokens:
        assert claims["iss"] == fake.access
        assert claims["exp"] - claims["nbf"] == 1805
    assert all(fake.secret.encode() not in r.body for r in fake.requests)
    assert all(fake.secret not in str(r.headers) for r in fake.requests)
    (created,) = [r for r in fake.requests if r.method == "POST"]
    assert created.path == "/v1/videos/image2video"
    sent = created.json()
    assert base64.b64decode(sent["image"]) == image  # bare base64, no data: prefix
    assert (sent["model_name"], sent["mode"], sent["duration"]) == (
        "kling-v3",
        "std",
        "5",
    )
    assert "seed" not in sent


@pytest.mark.parametrize("vendor", [VENDORS[1]], ids=["kling"], indirect=True)
async def test_a_webp_or_small_reference_reaches_kling_as_a_png_it_reads(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """Kling reads JPEG or PNG of 300 px a side: a 150x100 WebP goes as a 450x300
    PNG of the same picture (the fake refuses anything else with 1201)."""
    picture = Image.new("RGB", (150, 100), "navy")
    picture.paste(Image.new("RGB", (75, 100), "gold"), (75, 0))
    buffer = io.BytesIO()
    picture.save(buffer, format="WEBP", lossless=True)
    upload = await _upload(client, buffer.getvalue(), "image/webp")
    async with running_worker(redis, settings):
        done = await finished(
            client,
            await submit(
                client, model="kling-3", prompt="转身", reference=upload["id"]
            ),
        )
    assert done["status"] == "succeeded", done
    (created,) = [r for r in fake.requests if r.method == "POST"]
    with Image.open(io.BytesIO(base64.b64decode(created.json()["image"]))) as sent:
        assert (sent.format, sent.size) == ("PNG", (450, 300))
        assert sent.convert("RGB").getpixel((10, 150)) == (0, 0, 128)
        assert sent.convert("RGB").getpixel((440, 150)) == (255, 215, 0)


@pytest.mark.parametrize("vendor", [VENDORS[1]], ids=["kling"], indirect=True)
async def test_a_reference_kling_cannot_take_is_refused_at_submit_not_charged(
    client: Client, fake: FakeTasks
) -> None:
    """Kling takes references from 1:2.5 to 2.5:1: a longer one is a 400 with
    field reference before any charge; 2.5:1 itself is taken."""
    ids = {}
    for size in ((1000, 300), (300, 1000), (750, 300)):
        ids[size] = (await _upload(client, png(*size)))["id"]
    for size in ((1000, 300), (300, 1000)):
        response = await client.post(
            "/api/generations",
            json={"model": "kling-3", "prompt": "转身", "reference": ids[size]},
        )
        assert (response.status, await response.json()) == (
            400,
            {"error": "BAD_REQUEST", "field": "reference"},
        )
    assert await balance(client) == TRIAL
    taken = await client.post(
        "/api/generations",
        json={"model": "kling-3", "prompt": "转身", "reference": ids[(750, 300)]},
    )
    assert taken.status == 202, await taken.text()


@pytest.mark.parametrize("vendor", [VENDORS[1]], ids=["kling"], indirect=True)
async def test_a_wrong_kling_secret_is_refused_by_the_jwt_check(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis,
    make_settings: SettingsFactory, env: dict[str, str],
) -> None:  # fmt: skip
    """A token signed with another secret: 401 code 1002, UPSTREAM_FAILED, refunded."""
    wrong = make_settings(
        **{**env, "STUDIO_UPSTREAMS_KLING_API_KEY": "ak-test-0a1b2c3d:x"}
    )
    async with running_worker(redis, wrong):
        done = await finished(client, await submit(client, model="kling-3", prompt="p"))
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert isinstance(fake, FakeKling)
    assert fake.tokens == []
    await assert_books(client, 50, refunded=True)


@pytest.mark.parametrize("vendor", [VENDORS[2]], ids=["minimax"], indirect=True)
async def test_minimax_success_goes_through_files_retrieve(
    client: Client, fake: FakeTasks, settings: Settings, redis: Redis
) -> None:
    """create → query (Queueing, Processing, Success) → files/retrieve → download."""
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="hailuo-2-3", prompt="a spin")
        )
    assert done["status"] == "succeeded", done
    (created,) = fake.api_requests("/v1/video_generation")
    assert created.json() == {
        "model": "MiniMax-Hailuo-2.3", "prompt": "a spin", "duration": 6,
        "resolution": "768P", "prompt_optimizer": False,
    }  # fmt: skip
    (retrieved,) = fake.api_requests("/v1/files/retrieve")
    assert retrieved.headers["Authorization"] == f"Bearer {VENDORS[2].key}"
    assert len(fake.api_requests("/v1/query/video_generation")) >= 2


def _with_image_row(upstream: str, upstream_model: str) -> Content:
    """The catalogue plus an image row on an upstream that has none by default."""
    content = load_content()
    base = next(model for model in content.models if model.id == "seedream-5")
    row = dataclasses.replace(
        base, id="extra-image", upstream=upstream, upstream_model=upstream_model,
        sizes=("1024x1024", "1280x720"), credits=3, fields=("seed",),
        accepts_reference=False,
    )  # fmt: skip
    return dataclasses.replace(content, models=(*content.models, row))


@pytest.mark.parametrize("vendor", [VENDORS[1]], ids=["kling"], indirect=True)
async def test_kling_images_are_one_task_of_n_images(
    aiohttp_client: AiohttpClient,
    fake: FakeTasks,
    settings: Settings,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """POST /v1/images/generations with n; task_result.images all copied."""
    content = _with_image_row("kling", "kling-v3-omni")
    client = await aiohttp_client(create_app(settings, content=content))
    await sign_in(client, mail_server)
    async with running_worker(redis, settings, content):
        done = await finished(
            client,
            await submit(client, model="extra-image", prompt="海报", count=3,
                         size="1280x720"),
        )  # fmt: skip
    assert done["status"] == "succeeded", done
    (created,) = fake.api_requests("/v1/images/generations")
    assert created.json() == {
        "model_name": "kling-v3-omni", "prompt": "海报", "n": 3, "aspect_ratio": "16:9",
    }  # fmt: skip
    assert len(done["works"]) == 3
    await assert_books(client, 9, refunded=False)


@pytest.mark.parametrize("vendor", [VENDORS[2]], ids=["minimax"], indirect=True)
async def test_minimax_image_01_answers_base64_at_once(
    aiohttp_client: AiohttpClient,
    fake: FakeTasks,
    settings: Settings,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """One call, response_format base64, n images decoded; a 1026 is blocked."""
    content = _with_image_row("minimax", "image-01")
    client = await aiohttp_client(create_app(settings, content=content))
    await sign_in(client, mail_server)
    async with running_worker(redis, settings, content):
        done = await finished(
            client,
            await submit(client, model="extra-image", prompt="海报", count=2, seed=4),
        )
        assert done["status"] == "succeeded", done
        fake.script(Canned(200, minimax_answer(1026, "input new_sensitive")))
        refused = await finished(
            client, await submit(client, model="extra-image", prompt="不该画的")
        )
    assert (refused["status"], refused["error"]) == ("failed", "CONTENT_BLOCKED")
    first = fake.api_requests("/v1/image_generation")[0]
    assert first.json() == {
        "model": "image-01", "prompt": "海报", "aspect_ratio": "1:1",
        "response_format": "base64", "seed": 4, "n": 2, "prompt_optimizer": False,
    }  # fmt: skip
    assert len(done["works"]) == 2
    kinds = [entry["kind"] for entry in await ledger(client)]
    assert kinds == ["grant", "debit", "debit", "refund"]
    assert await balance(client) == TRIAL - 6
