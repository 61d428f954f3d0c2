"""The `openai` protocol end to end: the real app, a real worker process, and a
fake Images API on loopback answering as OpenAI's reference shows.

OpenAI's own model in the catalog (gpt-image-1) is retired, so these tests
route a live image model (seedream-4, upstream "fal") to a provider speaking
the openai protocol, as an operator may: STUDIO_UPSTREAMS_FAL_PROTOCOL=openai.
"""

from __future__ import annotations

import asyncio
import base64
import io
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.keys import CONTENT, SETTINGS
from service.settings import SettingsError, UpstreamSettings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import ROUTING
from service.studio.upstreams.base import Request
from service.studio.upstreams.openai import OpenAIUpstream
from service.studio.upstreams.registry import Upstreams

from .conftest import Client, SettingsFactory
from .processes import Output, output_of
from .upstream_fakes import OPENAI_ERRORS, Canned, FakeOpenAI, png
from .workbench import balance, ledger, sign_in, wait_for_status, worker_process

Env = dict[str, str]
MakeClient = Callable[..., Any]
KEY = "sk-proj-" + secrets.token_hex(20)
PATH = "/v1/images/generations"
MODEL = "seedream-4"  # upstream "fal", configured below to speak openai
UPSTREAM_MODEL = "fal-ai/bytedance/seedream/v4/text-to-image"
PRICE = 6


@pytest.fixture
async def fake() -> AsyncIterator[FakeOpenAI]:
    """OpenAI's Images API on loopback, holding KEY."""
    async with FakeOpenAI(KEY) as server:
        yield server


@pytest.fixture
def openai_env(tmp_path: Path, redis_server: RedisServer, fake: FakeOpenAI) -> Env:
    """Settings of the app and its workers: no demo, the openai upstream at the fake."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
        "STUDIO_JOBS_VISIBILITY_TIMEOUT": "5",
        "STUDIO_UPSTREAMS_FAL_PROTOCOL": "openai",
        "STUDIO_UPSTREAMS_FAL_BASE_URL": fake.base_url,
        "STUDIO_UPSTREAMS_FAL_API_KEY": KEY,
        "STUDIO_UPSTREAMS_FAL_TIMEOUT": "1",
    }


@pytest.fixture
def studio(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    openai_env: Env,
    redis: Redis,
) -> MakeClient:
    """Build a signed-in client on the real app with the openai upstream."""

    async def factory(mail_server: MailCatcher, **extra: str) -> Client:
        settings = make_settings(**{**openai_env, **extra})
        client = await aiohttp_client(create_app(settings))
        await sign_in(client, mail_server)
        return client

    return factory


@contextmanager
def worker(env: Env) -> Iterator[Output]:
    """Run a worker process; what it prints is collected as it comes."""
    with worker_process(env) as process:
        yield output_of(process)


async def _submit(client: Client, **body: Any) -> dict[str, Any]:
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp", **body}
    )
    assert response.status == 202, await response.text()
    generation: dict[str, Any] = await response.json()
    return generation


async def _run(client: Client, env: Env, **body: Any) -> tuple[dict[str, Any], str]:
    """Submit one generation and let a worker settle it; return it and the log."""
    generation = await _submit(client, **body)
    with worker(env) as printed:
        done = await wait_for_status(
            client, generation["id"], {"succeeded", "failed"}, 30
        )
    return done, printed.text()


def _stored_files(media: Path) -> list[Path]:
    """Every file the media store holds."""
    return [path for path in media.rglob("*") if path.is_file()]


def _kinds(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["kind"] for entry in entries]


async def test_an_image_comes_back_as_base64_with_the_documented_request(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI, openai_env: Env
) -> None:
    """Bearer key, model id, n, size and response_format go out; PNGs come back."""
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env, count=2, size="1536x1024")
    assert done["status"] == "succeeded"
    assert done["refunded"] is False
    (sent,) = fake.api_requests(PATH)
    assert sent.headers["Authorization"] == f"Bearer {KEY}"
    assert sent.json() == {
        "model": UPSTREAM_MODEL,
        "prompt": "a lamp",
        "n": 2,
        "size": "1536x1024",
        "response_format": "b64_json",
    }
    assert len(done["works"]) == 2
    for work in done["works"]:
        media = await client.get(work["media_url"])
        assert media.headers["Content-Type"] == "image/png"
        assert Image.open(io.BytesIO(await media.read())).size == (1536, 1024)
    assert _kinds(await ledger(client)) == ["grant", "debit"]
    assert await balance(client) == 100 - 2 * PRICE


async def test_an_image_answered_as_a_url_is_downloaded(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI, openai_env: Env
) -> None:
    """A provider answering `url` gets its file fetched (no key sent elsewhere)."""
    fake.mode = "url"
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env)
    assert done["status"] == "succeeded"
    (work,) = done["works"]
    media = await client.get(work["media_url"])
    assert Image.open(io.BytesIO(await media.read())).format == "PNG"
    assert _kinds(await ledger(client)) == ["grant", "debit"]


REFUSALS = [
    pytest.param(
        Canned(400, OPENAI_ERRORS["content_policy_violation"]),
        "CONTENT_BLOCKED",
        id="400-content-policy",
    ),
    pytest.param(
        Canned(400, OPENAI_ERRORS["moderation_blocked"]),
        "CONTENT_BLOCKED",
        id="400-moderation-blocked",
    ),
    pytest.param(
        Canned(400, OPENAI_ERRORS["invalid_value"]), "UPSTREAM_FAILED", id="400-other"
    ),
    pytest.param(
        Canned(401, {"error": {"code": "invalid_api_key"}}),
        "UPSTREAM_FAILED",
        id="401",
    ),
    pytest.param(Canned(403, {"error": {}}), "UPSTREAM_FAILED", id="403"),
    pytest.param(Canned(404, {"error": {}}), "UPSTREAM_FAILED", id="404"),
    pytest.param(Canned(422, {"error": {}}), "UPSTREAM_FAILED", id="422"),
    pytest.param(
        Canned(200, "<html>Bad gateway</html>", {"Content-Type": "text/html"}),
        "UPSTREAM_FAILED",
        id="2xx-html",
    ),
    pytest.param(Canned(200, {"created": 1}), "UPSTREAM_FAILED", id="2xx-no-data"),
    pytest.param(
        Canned(200, {"data": [{"b64_json": "not base64!"}]}),
        "UPSTREAM_FAILED",
        id="2xx-bad-base64",
    ),
    pytest.param(
        Canned(200, {"data": [{"b64_json": base64.b64encode(b"<svg/>").decode()}]}),
        "UPSTREAM_FAILED",
        id="2xx-not-an-image",
    ),
]


@pytest.mark.parametrize(("answer", "code"), REFUSALS)
async def test_a_refusal_or_unreadable_answer_fails_at_once_and_refunds(
    studio: MakeClient,
    mail_server: MailCatcher,
    fake: FakeOpenAI,
    openai_env: Env,
    answer: Canned,
    code: str,
) -> None:
    """No retry: one request upstream, the public code, one debit, one refund."""
    fake.script(answer)
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env)
    assert (done["status"], done["error"], done["refunded"]) == ("failed", code, True)
    assert len(fake.api_requests(PATH)) == 1
    assert _kinds(await ledger(client)) == ["grant", "debit", "refund"]
    assert await balance(client) == 100


TRANSIENT = [
    pytest.param(Canned(408, {"error": {}}), id="408"),
    pytest.param(Canned(409, {"error": {}}), id="409"),
    pytest.param(Canned(500, OPENAI_ERRORS["server_error"]), id="500"),
    pytest.param(Canned(503, "upstream connect error"), id="503"),
    pytest.param(Canned(delay=2.5), id="timeout"),
    pytest.param(Canned(drop=True), id="connection-dropped"),
]


@pytest.mark.parametrize("answer", TRANSIENT)
async def test_a_transient_fault_is_retried_and_charged_once(
    studio: MakeClient,
    mail_server: MailCatcher,
    fake: FakeOpenAI,
    openai_env: Env,
    answer: Canned,
) -> None:
    """The worker asks again; the second answer succeeds; no refund, no 2nd debit."""
    fake.script(answer)
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env)
    assert (done["status"], done["refunded"]) == ("succeeded", False)
    assert len(fake.api_requests(PATH)) == 2
    assert _kinds(await ledger(client)) == ["grant", "debit"]


async def test_429_is_retried_after_the_time_it_asks_for(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI, openai_env: Env
) -> None:
    """Retry-After: 3 holds the second request back about three seconds."""
    fake.script(Canned(429, OPENAI_ERRORS["rate_limit_exceeded"], {"Retry-After": "3"}))
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env)
    assert done["status"] == "succeeded"
    first, second = fake.api_requests(PATH)
    assert second.at - first.at >= 2.8
    assert _kinds(await ledger(client)) == ["grant", "debit"]


async def test_a_fault_that_never_clears_times_out_and_refunds_once(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI, openai_env: Env
) -> None:
    """5xx after 5xx: retried until the deadline, then TIMED_OUT and one refund."""
    fake.script(*[Canned(502, "bad gateway")] * 50)
    env = {**openai_env, "STUDIO_JOBS_IMAGE_DEADLINE": "5"}
    client = await studio(mail_server, STUDIO_JOBS_IMAGE_DEADLINE="5")
    with worker(env) as printed:
        # The deadline runs from submit: submit once the worker is up.
        await asyncio.to_thread(printed.wait_for, "jobs at once")
        generation = await _submit(client)
        done = await wait_for_status(client, generation["id"], {"failed"}, 30)
    assert (done["status"], done["error"]) == ("failed", "TIMED_OUT")
    assert len(fake.api_requests(PATH)) >= 2
    assert _kinds(await ledger(client)) == ["grant", "debit", "refund"]


def _bad_results(fake: FakeOpenAI) -> dict[str, str]:
    """Result URLs a worker must not take, each for its own reason."""
    fake.serve("ok.png", png(1024, 1024), "image/png")
    return {
        "private-host": fake.url_at("localhost", "/files/ok.png"),
        "private-literal": "http://10.255.255.1/x.png",
        "metadata-address": "http://169.254.169.254/latest/meta-data",
        "redirect-to-private": fake.redirect_to(
            fake.url_at("localhost", "/files/ok.png")
        ),
        "html": fake.serve("page.png", b"<!doctype html><p>hi", "text/html"),
        "json": fake.serve("j.png", b'{"error":"x"}', "application/json"),
        "declared-too-big": fake.serve_flood("big.png", 2 * 1024**3),
        "grown-too-big": fake.serve_flood("grow.png", 51 * 1024**2, declared=False),
        "not-http": "file:///etc/passwd",
    }


@pytest.mark.parametrize(
    "reason",
    [
        "private-host",
        "private-literal",
        "metadata-address",
        "redirect-to-private",
        "html",
        "json",
        "declared-too-big",
        "grown-too-big",
        "not-http",
    ],
)
async def test_a_result_url_that_is_unsafe_fails_cleanly(
    studio: MakeClient,
    mail_server: MailCatcher,
    fake: FakeOpenAI,
    openai_env: Env,
    reason: str,
) -> None:
    """Private addresses, HTML/JSON and oversized bodies never reach the store."""
    url = _bad_results(fake)[reason]
    fake.script(Canned(200, {"created": 1, "data": [{"url": url}]}))
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env)
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert done["works"] == []
    assert _kinds(await ledger(client)) == ["grant", "debit", "refund"]
    assert _stored_files(Path(openai_env["STUDIO_MEDIA_DIR"])) == []


async def test_fewer_images_than_paid_for_fail_and_refund(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI, openai_env: Env
) -> None:
    """Asked for 3, given 1: nobody pays for images that did not come."""
    one = base64.b64encode(png(1024, 1024)).decode()
    fake.script(Canned(200, {"data": [{"b64_json": one}]}))
    client = await studio(mail_server)
    done, _ = await _run(client, openai_env, count=3)
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert _kinds(await ledger(client)) == ["grant", "debit", "refund"]
    assert await balance(client) == 100


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"negative_prompt": "blurry"}, "negative_prompt"),
        ({"seed": 7}, "seed"),
    ],
)
async def test_a_field_the_api_cannot_take_is_refused_before_charging(
    studio: MakeClient,
    mail_server: MailCatcher,
    fake: FakeOpenAI,
    extra: dict[str, Any],
    field: str,
) -> None:
    """400 BAD_REQUEST naming the field; the balance and ledger stay untouched."""
    client = await studio(mail_server)
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a", **extra}
    )
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST", "field": field}
    assert _kinds(await ledger(client)) == ["grant"]
    assert fake.requests == []


async def test_a_reference_image_is_refused_before_charging(
    studio: MakeClient, mail_server: MailCatcher, fake: FakeOpenAI
) -> None:
    """The model takes references elsewhere; on this protocol the field is refused."""
    client = await studio(mail_server)
    form = aiohttp.FormData()
    form.add_field("file", png(256, 256), filename="r.png", content_type="image/png")
    uploaded = await client.post("/api/uploads", data=form)
    assert uploaded.status == 201, await uploaded.text()
    reference = (await uploaded.json())["id"]
    response = await client.post(
        "/api/generations",
        json={"model": MODEL, "prompt": "a", "reference": reference},
    )
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST", "field": "reference"}
    assert _kinds(await ledger(client)) == ["grant"]
    assert fake.requests == []


async def test_gpt_image_models_are_asked_for_png_instead_of_a_response_format(
    fake: FakeOpenAI,
) -> None:
    """GPT Image models take output_format and always answer base64."""
    adapter = OpenAIUpstream(
        UpstreamSettings("openai", "openai", fake.base_url, KEY, 0, 5.0)
    )
    seen: list[float] = []

    async def progress(fraction: float) -> None:
        seen.append(fraction)

    request = Request(
        model="gpt-image-1",
        upstream_model="gpt-image-1",
        kind="image",
        prompt="a lamp",
        negative_prompt="",
        width=1024,
        height=1536,
        count=1,
        seed=0,
        seconds=None,
        reference=None,
    )
    try:
        (output,) = await adapter.generate(request, progress)
    finally:
        await adapter.aclose()
    assert fake.api_requests(PATH)[0].json() == {
        "model": "gpt-image-1",
        "prompt": "a lamp",
        "n": 1,
        "size": "1024x1536",
        "output_format": "png",
    }
    assert output.extension == "png"
    assert Image.open(io.BytesIO(output.data)).size == (1024, 1536)
    assert seen
    assert all(0 < fraction < 1 for fraction in seen)
    assert KEY not in repr(adapter)


async def test_an_empty_negative_prompt_is_not_a_refusal(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Only a negative prompt with words in it asks for something missing."""
    client = await studio(mail_server)
    await _submit(client, negative_prompt="  ")


async def test_without_a_key_the_model_is_unavailable(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """No key: /api/models says so and submit answers MODEL_UNAVAILABLE."""
    client = await studio(mail_server, STUDIO_UPSTREAMS_FAL_API_KEY="")
    models = {
        m["id"]: m for m in (await (await client.get("/api/models")).json())["models"]
    }
    assert models[MODEL]["available"] is False
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a"}
    )
    assert response.status == 400
    assert await response.json() == {"error": "MODEL_UNAVAILABLE"}
    with_key = await studio(mail_server)
    models = {
        m["id"]: m for m in (await (await with_key.get("/api/models")).json())["models"]
    }
    assert models[MODEL]["available"] is True


async def test_the_key_reaches_no_log_and_no_answer(
    studio: MakeClient,
    mail_server: MailCatcher,
    fake: FakeOpenAI,
    openai_env: Env,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Refusals echoing the key's end, retries and success: the key stays ours."""
    caplog.set_level("DEBUG")
    refused = {
        "error": {
            "message": f"Incorrect API key provided: {KEY}.",
            "type": "invalid_request_error",
            "code": "invalid_api_key",
        }
    }
    fake.script(Canned(500, "oops"), Canned(drop=True))
    client = await studio(mail_server)
    answers: list[str] = []
    ok = await _submit(client)
    with worker(openai_env) as printed:
        done = await wait_for_status(client, ok["id"], {"succeeded"}, 30)
        fake.script(Canned(401, refused))
        bad = await _submit(client)
        failed = await wait_for_status(client, bad["id"], {"failed"}, 30)
        for path in ("/api/models", "/api/generations", "/api/credits", "/api/me"):
            answers.append(await (await client.get(path)).text())  # noqa: PERF401
    answers += [str(done), str(failed)]
    logs = printed.text() + caplog.text
    assert "upstream busy" in logs  # the worker did log about this upstream
    for text in [logs, *answers]:
        assert KEY not in text
        assert KEY[-8:] not in text
    assert KEY not in repr(client.app[SETTINGS]) + repr(client.app[ROUTING])
    upstreams = Upstreams(client.app[SETTINGS].workbench)  # as a worker has them
    adapters = [repr(upstreams(model)) for model in client.app[CONTENT].models]
    assert "OpenAIUpstream(" in " ".join(adapters)
    assert KEY not in " ".join(adapters)
    await upstreams.aclose()


def test_an_openai_base_url_with_v1_is_refused_at_start(
    make_settings: SettingsFactory,
) -> None:
    """The paths carry /v1; a base_url ending in it would ask /v1/v1/..."""
    with pytest.raises(SettingsError, match="STUDIO_UPSTREAMS_OPENAI_BASE_URL"):
        make_settings(STUDIO_UPSTREAMS_OPENAI_BASE_URL="https://api.openai.com/v1")


def test_another_provider_of_the_protocol_is_one_more_set_of_variables(
    make_settings: SettingsFactory,
) -> None:
    """A new upstream name comes from variables alone; its key stays out of reprs."""
    settings = make_settings(
        STUDIO_UPSTREAMS_MY_PROVIDER_PROTOCOL="openai",
        STUDIO_UPSTREAMS_MY_PROVIDER_BASE_URL="https://images.example.com/",
        STUDIO_UPSTREAMS_MY_PROVIDER_API_KEY=KEY,
    )
    upstream = settings.workbench.upstreams["my_provider"]
    assert (upstream.protocol, upstream.base_url) == (
        "openai",
        "https://images.example.com",
    )
    assert upstream.api_key == KEY
    assert KEY not in repr(settings)
