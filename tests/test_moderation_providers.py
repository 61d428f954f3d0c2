"""The moderation providers: Tencent TMS/IMS, Alibaba Cloud and Volcengine.

Each on a loopback fake that checks its signing as the vendor does, every test
run against each: prompts after the list, uploads, and every output before its
generation succeeds (through a real worker process): a refusal refunds once and
leaves no media; a provider that hangs is asked again until shortly before the
job's deadline, then the generation fails UPSTREAM_FAILED, refunded once.
Alibaba and Volcengine fetch images by URL: the app's own /media/ URL (the app
listens on its base URL here) or, for a bucket, a presigned one, and the fake
fetches it.
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import obstore
import pytest
from aiohttp import web
from aiohttp.pytest_plugin import AiohttpClient, AiohttpServer
from alibabacloud_green20220302 import models as green_models
from alibabacloud_green20220302.client import Client as GreenClient
from alibabacloud_tea_openapi.models import Config as GreenConfig
from obstore.store import S3Store
from PIL import Image
from redis.asyncio import Redis
from Tea.exceptions import TeaException
from tencentcloud.common import credential
from tencentcloud.common.common_client import CommonClient
from tencentcloud.common.profile.client_profile import ClientProfile
from tencentcloud.common.profile.http_profile import HttpProfile
from volcengine.content_security.ContentSecurityService import (
    ContentSecurityService,
)

from service.app import create_app
from service.moderation.log import ModerationLog
from service.moderation.providers.base import Picture, ProviderError
from service.moderation.providers.chosen import provider_for
from service.settings import ModerationSettings
from service.store.embedded import MailCatcher, RedisServer

from . import test_media_s3
from .conftest import Client, Env, MakeClient, SettingsFactory
from .moderation_fakes import APP_ID, FAKES, SECRET_ID, SECRET_KEY, FakeProvider
from .ports import free_port
from .test_media_s3 import S3Server
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process

# SeaweedFS's `weed mini`, once for this module, as tests/test_media_s3.py starts it.
seaweedfs = test_media_s3.s3_server


@pytest.fixture(params=sorted(FAKES))
async def fake(request: pytest.FixtureRequest) -> AsyncIterator[FakeProvider]:
    """Each provider on loopback, in turn."""
    async with FAKES[request.param]() as server:
        yield server


@pytest.fixture
def app_port() -> int:
    """The port the app listens on: its base URL, which Alibaba's fetches reach."""
    return free_port()


@pytest.fixture
def studio(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, studio_env: Env,
    redis: Redis, app_port: int,
) -> MakeClient:  # fmt: skip
    """The workbench's app, listening on its base URL's port."""

    async def factory(**extra: str) -> Client:
        settings = make_settings(**{**studio_env, **extra})
        app = create_app(settings)
        return await aiohttp_client(app, server_kwargs={"port": app_port})

    return factory


@pytest.fixture
def provider_env(studio_env: Env, fake: FakeProvider, app_port: int) -> Env:
    """The workbench's settings with the provider pointed at the fake."""
    return {
        **studio_env,
        "STUDIO_BASE_URL": f"http://127.0.0.1:{app_port}",
        "STUDIO_MODERATION_PROVIDER": fake.name,
        "STUDIO_MODERATION_ACCESS_KEY_ID": SECRET_ID,
        "STUDIO_MODERATION_ACCESS_KEY_SECRET": SECRET_KEY,
        "STUDIO_MODERATION_ENDPOINT": fake.base_url,
        "STUDIO_MODERATION_APP_ID": APP_ID,
    }


def _png() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), (30, 120, 200)).save(out, "PNG")
    return out.getvalue()


def _tencent_sdk(port: int, secret: str) -> str:
    """TMS TextModeration through Tencent's SDK: the Suggestion or the error code."""
    profile = ClientProfile(
        httpProfile=HttpProfile(protocol="http", endpoint=f"127.0.0.1:{port}")
    )
    client = CommonClient(
        "tms", "2020-12-29", credential.Credential(SECRET_ID, secret), "ap-guangzhou",
        profile,
    )  # fmt: skip
    answer = client.call_json("TextModeration", {"Content": "YSBsYW1w"})["Response"]
    return str(answer.get("Suggestion") or answer["Error"]["Code"])


def _aliyun_sdk(port: int, secret: str) -> str:
    """TextModerationPlus through Alibaba's SDK: the RiskLevel or the error code."""
    config = GreenConfig(
        access_key_id=SECRET_ID, access_key_secret=secret,
        endpoint=f"127.0.0.1:{port}", protocol="http",
    )  # fmt: skip
    request = green_models.TextModerationPlusRequest(
        service="llm_query_moderation", service_parameters='{"content": "a lamp"}'
    )
    try:
        answer = GreenClient(config).text_moderation_plus(request)
    except TeaException as err:
        return str(err.code)
    return str(answer.body.data.risk_level)


def _volcengine_sdk(port: int, secret: str) -> str:
    """TextSliceRisk through Volcengine's SDK: the Decision or the error code."""
    service = ContentSecurityService()
    service.set_ak(SECRET_ID)
    service.set_sk(secret)
    service.set_host(f"127.0.0.1:{port}")
    service.set_scheme("http")
    parameters = {"biztype": "prompt", "text": "a lamp", "account_id": "1"}
    body = {
        "AppId": int(APP_ID), "Service": "text_risk",
        "Parameters": json.dumps({**parameters, "operate_time": int(time.time())}),
    }  # fmt: skip
    try:
        answer = service.text_slice_risk({}, body)
    except Exception as err:  # the SDK raises the text of any non-200 answer
        return str(json.loads(err.args[0])["ResponseMetadata"]["Error"]["Code"])
    return str(answer["Result"]["Data"]["Decision"])


SDKS: dict[str, Callable[[int, str], str]] = {
    "tencent": _tencent_sdk,
    "aliyun": _aliyun_sdk,
    "volcengine": _volcengine_sdk,
}
PASSED = {"tencent": "Pass", "aliyun": "none", "volcengine": "PASS"}
BAD_SIGNATURE = {
    "tencent": "AuthFailure.SignatureFailure",
    "aliyun": "SignatureDoesNotMatch",
    "volcengine": "SignatureDoesNotMatch",
}


async def test_the_official_sdks_requests_pass_the_fakes_signature_check(
    fake: FakeProvider,
) -> None:
    """The fake's check accepts the vendor's own SDK and refuses a wrong secret."""
    call = SDKS[fake.name]
    assert await asyncio.to_thread(call, fake.port, SECRET_KEY) == PASSED[fake.name]
    wrong = await asyncio.to_thread(call, fake.port, "another-secret-0123456789")
    assert wrong == BAD_SIGNATURE[fake.name]
    assert fake.refused == ["signature"]


@pytest.fixture
async def png_url(aiohttp_server: AiohttpServer) -> str:
    """A PNG on loopback, for the providers that fetch images by URL."""

    async def png(request: web.Request) -> web.Response:
        return web.Response(body=_png(), content_type="image/png")

    app = web.Application()
    app.router.add_get("/a.png", png)
    return str((await aiohttp_server(app)).make_url("/a.png"))


def _client(fake: FakeProvider, secret: str = SECRET_KEY) -> Any:
    options = ModerationSettings(
        provider=fake.name, access_key_id=SECRET_ID, access_key_secret=secret,
        endpoint=fake.base_url, timeout=5.0, app_id=APP_ID,
    )  # fmt: skip
    return provider_for(options)


async def test_our_client_is_accepted_and_reads_the_verdicts(
    fake: FakeProvider, png_url: str
) -> None:
    """Text and image calls pass the check; refusals block; errors are ProviderError."""
    client = _client(fake)
    fake.blocked_words = {"forbidden"}
    assert (await client.text("a lamp")).blocked is False
    verdict = await client.text("a forbidden idea")
    assert (verdict.blocked, verdict.label) == (True, fake.text_label)
    picture = Picture(_png(), png_url)
    assert (await client.image(picture)).blocked is False
    fake.block_images = True
    verdict = await client.image(picture)
    assert (verdict.blocked, verdict.label) == (True, fake.image_label)
    assert [action for action, _ in fake.requests] == [
        fake.text_action, fake.text_action, fake.image_action, fake.image_action,
    ]  # fmt: skip
    fake.image_verdict = fake.review  # a person should look: it passes
    assert (await client.image(picture)).blocked is False
    fake.image_verdict = "Perhaps"  # nothing passes unread
    with pytest.raises(ProviderError, match="no "):
        await client.image(picture)
    wrong = _client(fake, "x" * 32)
    with pytest.raises(ProviderError, match=BAD_SIGNATURE[fake.name]):
        await wrong.text("a lamp")
    assert fake.refused == ["signature"]
    assert SECRET_KEY not in repr(client)
    assert "x" * 32 not in repr(wrong)


async def test_a_prompt_the_provider_blocks_is_refused_after_the_list(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    redis: Redis,
) -> None:  # fmt: skip
    """The list first (no provider call), then the provider; 400 and one record."""
    client = await studio(**provider_env)
    await sign_in(client, mail_server)
    fake.blocked_words = {"forbidden"}

    async def submit(prompt: str) -> Any:
        response = await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": prompt}
        )
        return response.status, await response.json()

    assert await submit("child porn") == (
        400, {"error": "CONTENT_BLOCKED", "field": "prompt"},
    )  # fmt: skip
    assert fake.texts() == 0  # the list answered
    assert await submit("a forbidden idea") == (
        400, {"error": "CONTENT_BLOCKED", "field": "prompt"},
    )  # fmt: skip
    status, _ = await submit("a lamp")
    assert status == 202
    assert await balance(client) == 94
    records = [r async for r in ModerationLog(redis, 180).read()]
    assert [r["rule"] for r in records] == ["child porn", fake.text_label]


async def test_an_upload_the_provider_blocks_is_not_kept(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    redis: Redis, tmp_path: Path,
) -> None:  # fmt: skip
    """400 CONTENT_BLOCKED {field: file}; no file in the media store; one record."""
    client = await studio(**provider_env)
    await sign_in(client, mail_server)
    fake.block_images = True
    response = await client.post("/api/uploads", data={"file": io.BytesIO(_png())})
    assert response.status == 400
    assert await response.json() == {"error": "CONTENT_BLOCKED", "field": "file"}
    assert _files(Path(provider_env["STUDIO_MEDIA_DIR"])) == []
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["rule"]) == ("upload", fake.image_label)
    media = provider_env["STUDIO_BASE_URL"] + "/media/"
    assert [url.startswith(media) for url in fake.fetched] == (
        [] if fake.name == "tencent" else [True]
    )  # the stored upload, fetched from the app before it was deleted
    fake.block_images = False
    response = await client.post("/api/uploads", data={"file": io.BytesIO(_png())})
    assert response.status == 201, await response.text()


def _files(directory: Path) -> list[Path]:
    return (
        [p for p in directory.rglob("*") if p.is_file()] if directory.exists() else []
    )


async def _books(client: Client) -> list[str]:
    return [entry["kind"] for entry in await ledger(client)]


@pytest.mark.parametrize(
    ("body", "price"),
    [
        ({"model": "seedream-4", "count": 2}, 12),
        ({"model": "kling-2-1", "size": "1280x720"}, 120),  # its poster refused
    ],
    ids=["images", "video"],
)
async def test_a_refused_output_is_refunded_once_and_leaves_no_media(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    redis: Redis, body: dict[str, Any], price: int,
) -> None:  # fmt: skip
    """A real worker: CONTENT_BLOCKED, one refund, no file, no work, one record."""
    client = await studio(**provider_env, STUDIO_TRIAL_CREDITS="200")
    await sign_in(client, mail_server)
    fake.block_images = True
    response = await client.post("/api/generations", json={"prompt": "a lamp", **body})
    assert response.status == 202
    gid = (await response.json())["id"]
    with worker_process(provider_env):
        done = await wait_for_status(client, gid, {"succeeded", "failed"}, 30)
        await asyncio.sleep(1.0)  # nothing more happens to it
    assert (done["status"], done["error"], done["refunded"]) == (
        "failed", "CONTENT_BLOCKED", True,
    )  # fmt: skip
    assert done["works"] == []
    entries = await ledger(client)
    assert [(e["kind"], e["amount"]) for e in entries] == [
        ("grant", 200), ("debit", -price), ("refund", price),
    ]  # fmt: skip
    assert _files(Path(provider_env["STUDIO_MEDIA_DIR"])) == []
    assert (await (await client.get("/api/works")).json())["items"] == []
    assert (await (await client.get("/api/square")).json())["items"] == []
    assert fake.images() == 1  # the first refusal decides
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["generation"], record["rule"]) == (
        "output", gid, fake.image_label,
    )  # fmt: skip


async def test_a_clip_is_checked_by_its_poster_and_a_frame_each_second_after_it(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    redis: Redis,
) -> None:  # fmt: skip
    """A 5 s clip is five image checks; a refused late frame fails it, refunded;
    the sampled frames are deleted once checked, whatever the verdict."""
    client = await studio(**provider_env, STUDIO_TRIAL_CREDITS="300")
    await sign_in(client, mail_server)
    body = {"model": "kling-2-1", "size": "1280x720", "prompt": "a lamp"}
    fake.block_image_at = 3  # the frame at 2 s
    refused = (await (await client.post("/api/generations", json=body)).json())["id"]
    with worker_process(provider_env):
        done = await wait_for_status(client, refused, {"succeeded", "failed"}, 60)
        assert (done["status"], done["error"], done["refunded"]) == (
            "failed", "CONTENT_BLOCKED", True,
        )  # fmt: skip
        assert fake.images() == 3  # the first refusal decides
        assert _files(Path(provider_env["STUDIO_MEDIA_DIR"])) == []
        fake.block_image_at = 0
        passed = (await (await client.post("/api/generations", json=body)).json())["id"]
        done = await wait_for_status(client, passed, {"succeeded", "failed"}, 60)
    assert done["status"] == "succeeded", done
    assert fake.images() == 3 + 5  # the poster, then 1, 2, 3 and 4 s
    (work,) = done["works"]
    kept = sorted(p.name for p in _files(Path(provider_env["STUDIO_MEDIA_DIR"])))
    shown = sorted(
        url.rsplit("/", 1)[1] for url in (work["media_url"], work["thumb_url"])
    )
    assert kept == shown  # the clip and its poster; no sampled frame is left
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["generation"]) == ("output", refused)


async def _submit_to_a_hanging_provider(
    client: Client, fake: FakeProvider, mail_server: MailCatcher
) -> str:
    """Sign in, make image checks hang, submit one image: its generation's id."""
    await sign_in(client, mail_server)
    fake.hang_images = True
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
    )
    return str((await response.json())["id"])


async def test_a_provider_that_hangs_fails_the_job_before_its_deadline_refunded_once(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    redis: Redis,
) -> None:  # fmt: skip
    """Asked again within the deadline, then UPSTREAM_FAILED; one refund, no media."""
    env = {
        **provider_env,
        "STUDIO_MODERATION_TIMEOUT": "1",
        "STUDIO_JOBS_IMAGE_DEADLINE": "7",
    }
    client = await studio(**env)
    gid = await _submit_to_a_hanging_provider(client, fake, mail_server)
    with worker_process(env):
        done = await wait_for_status(client, gid, {"succeeded", "failed"}, 30)
        await asyncio.sleep(1.5)  # the deadline passes: no second settlement
    assert (done["status"], done["error"], done["refunded"]) == (
        "failed", "UPSTREAM_FAILED", True,
    )  # fmt: skip
    assert fake.images() >= 2
    assert await _books(client) == ["grant", "debit", "refund"]
    assert _files(Path(env["STUDIO_MEDIA_DIR"])) == []
    assert [r async for r in ModerationLog(redis, 180).read()] == []


async def test_a_cancel_while_the_provider_is_asked_leaves_no_media(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
) -> None:  # fmt: skip
    """Outputs stored for the check are deleted by a cancel; refunded once."""
    client = await studio(**provider_env)
    gid = await _submit_to_a_hanging_provider(client, fake, mail_server)
    media = Path(provider_env["STUDIO_MEDIA_DIR"])
    with worker_process(provider_env):
        for _ in range(300):
            if fake.images():
                break
            await asyncio.sleep(0.05)
        assert _files(media)  # stored, waiting for the verdict
        canceled = await client.post(f"/api/generations/{gid}/cancel")
        assert canceled.status == 200
        for _ in range(100):
            if not _files(media):
                break
            await asyncio.sleep(0.05)
    assert _files(media) == []
    assert await _books(client) == ["grant", "debit", "refund"]


async def test_a_refused_output_leaves_nothing_in_the_bucket(
    studio: MakeClient, fake: FakeProvider, mail_server: MailCatcher,
    redis_server: RedisServer, seaweedfs: S3Server, tmp_path: Path,
) -> None:  # fmt: skip
    """With media in an S3 bucket (SeaweedFS): the refused outputs' objects are gone."""
    env = {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.5",
        "STUDIO_MEDIA_DIR": str(tmp_path / "not-used"),
        "STUDIO_MODERATION_PROVIDER": fake.name,
        "STUDIO_MODERATION_ACCESS_KEY_ID": SECRET_ID,
        "STUDIO_MODERATION_ACCESS_KEY_SECRET": SECRET_KEY,
        "STUDIO_MODERATION_ENDPOINT": fake.base_url,
        "STUDIO_MODERATION_APP_ID": APP_ID,
        **seaweedfs.env(),
    }
    config = seaweedfs.settings()
    bucket = S3Store(
        config.bucket,
        config={
            "endpoint": config.endpoint, "region": config.region,
            "access_key_id": config.access_key_id,
            "secret_access_key": config.secret_access_key,
            "virtual_hosted_style_request": False,
        },
        client_options={"allow_http": True},
    )  # fmt: skip
    before = {meta["path"] for meta in await obstore.list(bucket).collect_async()}
    client = await studio(**env)
    await sign_in(client, mail_server)
    fake.block_images = True
    response = await client.post(
        "/api/generations", json={"model": "seedream-4", "prompt": "a lamp", "count": 2}
    )
    gid = (await response.json())["id"]
    with worker_process(env):
        done = await wait_for_status(client, gid, {"succeeded", "failed"}, 30)
    assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
    assert fake.images() == 1  # the outputs were in the bucket
    after = {meta["path"] for meta in await obstore.list(bucket).collect_async()}
    assert after == before
    assert await _books(client) == ["grant", "debit", "refund"]


async def test_the_key_is_in_no_log_answer_or_repr(
    studio: MakeClient, provider_env: Env, fake: FakeProvider, mail_server: MailCatcher,
    make_settings: SettingsFactory, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Answers, log lines, a refused signature's error, the settings and the client."""
    caplog.set_level(logging.DEBUG)
    client = await studio(**provider_env)
    await sign_in(client, mail_server)
    fake.blocked_words = {"forbidden"}
    answers = []
    for prompt in ("a forbidden idea", "a lamp"):
        response = await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": prompt}
        )
        answers.append(await response.text())
    response = await client.post("/api/uploads", data={"file": io.BytesIO(_png())})
    answers.append(await response.text())
    assert fake.texts() == 2
    assert fake.images() == 1
    with pytest.raises(ProviderError) as refused:
        await _client(fake, SECRET_KEY[::-1]).text("a lamp")
    settings = make_settings(**provider_env)
    seen = [
        *answers, caplog.text, str(refused.value), repr(settings),
        repr(_client(fake)), repr(settings.workbench.moderation),
    ]  # fmt: skip
    assert [SECRET_KEY in text or SECRET_KEY[::-1] in text for text in seen] == [
        False
    ] * len(seen)


async def test_a_provider_that_fetches_by_url_warns_of_a_local_base_url(
    studio: MakeClient, provider_env: Env, fake: FakeProvider,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    """Alibaba and Volcengine cannot reach 127.0.0.1: serve says so at start-up."""
    caplog.set_level(logging.WARNING, logger="service.moderation.setup")
    await studio(**provider_env)
    warned = [r.getMessage() for r in caplog.records if "fetches images" in r.message]
    assert warned == (
        []
        if fake.name == "tencent"
        else [
            f"moderation provider {fake.name} fetches images by URL, but base_url"
            " (127.0.0.1) is not reachable from the internet"
        ]
    )
