"""Model retirement: from its retires_at a model is offered nowhere, without a restart.

The real app (real Redis, real SMTP, the demo upstream) with an injected clock:
a model retiring "today" is unavailable, refused before charging and gone from
the home pages and llms.txt; one retiring at the next midnight disappears from
the prepared documents when that midnight passes; its queued jobs fail and are
refunded by a real worker before they run.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
import tomllib
from pathlib import Path
from typing import Any, Final

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.clock import Clock, midnight, utc_now
from service.content import CONTENT_DIR, Content, load_content
from service.settings import ROOT, load_settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.media.store import DirectoryStore
from service.studio.upstreams.registry import Upstreams
from service.studio.worker import Worker

from .conftest import Client, Env, MakeClient, SettingsFactory
from .workbench import balance, ledger, sign_in, wait_for_status

MARKDOWN = {"Accept": "text/markdown"}
# The day the tests' model retires: far from the real date, so only the
# injected clock can make it "today".
RETIRES: Final = dt.date(2031, 3, 1)
MODEL = "seedream-4"
NAME = "Seedream 4.0"


def retiring(day: dt.date | None, model: str = MODEL) -> Content:
    """Return the catalog with only `model` carrying a retirement date."""
    content = load_content()
    models = tuple(
        dataclasses.replace(m, retires_at=day if m.id == model else None)
        for m in content.models
    )
    return dataclasses.replace(content, models=models)


def fixed(at: dt.datetime) -> Clock:
    """Return a clock stopped at one instant."""
    return lambda: at


@pytest.fixture
def studio_env(tmp_path: Path, redis_server: RedisServer) -> Env:
    """The demo upstream and a media directory, shared by app and worker."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_DEMO_UPSTREAM": "1",
        "STUDIO_DEMO_SECONDS": "0.2",
        "STUDIO_MEDIA_DIR": str(tmp_path / "media"),
    }


@pytest.fixture
def studio(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    studio_env: Env,
    redis: Redis,
) -> MakeClient:
    """Build a client on the real app with a given catalog and clock."""

    async def factory(content: Content, clock: Clock) -> Client:
        settings = make_settings(**studio_env)
        return await aiohttp_client(create_app(settings, content=content, clock=clock))

    return factory


async def _models(client: Client) -> dict[str, dict[str, Any]]:
    response = await client.get("/api/models")
    assert response.status == 200
    return {m["id"]: m for m in (await response.json())["models"]}


async def _offered_on_public_files(client: Client, name: str) -> list[bool]:
    """Tell, for /, /en (HTML and Markdown) and /llms.txt, whether `name` is offered."""
    found = []
    for path, headers in [
        ("/", {}),
        ("/en", {}),
        ("/", MARKDOWN),
        ("/en", MARKDOWN),
        ("/llms.txt", {}),
    ]:
        response = await client.get(path, headers=headers)
        assert response.status == 200
        found.append(name in await response.text())
    return found


async def test_a_model_retiring_today_is_unavailable_and_refused_before_charging(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """available=false with its date; submit answers 400 MODEL_UNAVAILABLE, no debit."""
    client = await studio(retiring(RETIRES), fixed(midnight(RETIRES)))
    models = await _models(client)
    assert models[MODEL]["available"] is False
    assert models[MODEL]["retires_at"] == RETIRES.isoformat()
    others = [m for m in models.values() if m["id"] != MODEL]
    assert all(m["available"] and m["retires_at"] is None for m in others)
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp"}
    )
    assert response.status == 400
    assert await response.json() == {"error": "MODEL_UNAVAILABLE"}
    assert [e["kind"] for e in await ledger(client)] == ["grant"]
    assert await balance(client) == 100


async def test_the_day_before_it_retires_a_model_is_still_offered_everywhere(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """One second before its midnight the model runs, is listed and can be bought."""
    last_second = midnight(RETIRES) - dt.timedelta(seconds=1)
    client = await studio(retiring(RETIRES), fixed(last_second))
    assert (await _models(client))[MODEL]["available"] is True
    assert await _offered_on_public_files(client, NAME) == [True] * 5
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp"}
    )
    assert response.status == 202, await response.text()


async def test_home_pages_and_llms_txt_no_longer_offer_a_retired_model(
    studio: MakeClient,
) -> None:
    """Hidden, not marked: the homes and llms.txt list only the models on offer."""
    client = await studio(retiring(RETIRES), fixed(midnight(RETIRES)))
    assert await _offered_on_public_files(client, NAME) == [False] * 5
    assert await _offered_on_public_files(client, "Kling 2.1") == [True] * 5
    html = await (await client.get("/en")).text()
    rows = re.findall(r"<tr><td>([^<]+)</td>", html)
    on_offer = [m.name for m in retiring(RETIRES).offered(RETIRES)]
    assert rows[: len(on_offer)] == on_offer


async def test_the_documents_change_at_the_retirement_midnight_without_a_restart(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """A clock 2.5 s before the midnight: the app swaps its prepared documents then."""
    offset = midnight(RETIRES) - dt.timedelta(seconds=2.5) - utc_now()

    def clock() -> dt.datetime:
        return utc_now() + offset

    client = await studio(retiring(RETIRES), clock)
    before = await client.get("/en")
    assert clock() < midnight(RETIRES), "the app took too long to start"
    assert NAME in await before.text()
    etag = before.headers["ETag"]
    while NAME in await (await client.get("/en")).text():
        assert clock() < midnight(RETIRES) + dt.timedelta(seconds=5), "no change"
        await asyncio.sleep(0.05)
    assert clock() >= midnight(RETIRES)  # at the midnight, not before
    after = await client.get("/en")
    assert after.headers["ETag"] != etag
    revalidated = await client.get("/en", headers={"If-None-Match": etag})
    assert revalidated.status == 200  # a cached copy is not kept
    assert await _offered_on_public_files(client, NAME) == [False] * 5
    assert (await _models(client))[MODEL]["available"] is False
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp"}
    )
    assert await response.json() == {"error": "MODEL_UNAVAILABLE"}


async def test_queued_jobs_of_a_retired_model_fail_and_are_refunded_before_running(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env, redis: Redis
) -> None:
    """Queued the day before; a worker on the day fails it unrun, and refunds it."""
    content = retiring(RETIRES)
    the_evening_before = midnight(RETIRES) - dt.timedelta(hours=1)
    client = await studio(content, fixed(the_evening_before))
    await sign_in(client, mail_server)
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp", "count": 2}
    )
    assert response.status == 202
    gid = (await response.json())["id"]
    assert await balance(client) == 88
    settings = load_settings(studio_env).workbench
    upstreams = Upstreams(settings)
    worker = Worker(
        redis=redis,
        content=content,
        settings=settings,
        media=DirectoryStore(settings.media_dir),
        upstream_for=upstreams,
        clock=fixed(midnight(RETIRES) + dt.timedelta(minutes=1)),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    try:
        body = await wait_for_status(client, gid, {"failed", "succeeded"}, 15)
    finally:
        stop.set()
        await task
        await upstreams.aclose()
    assert (body["status"], body["error"]) == ("failed", "MODEL_UNAVAILABLE")
    assert body["refunded"] is True
    assert body["started_at"] is None  # it never ran
    assert body["works"] == []
    assert [e["kind"] for e in await ledger(client)] == ["grant", "debit", "refund"]
    assert await balance(client) == 100


def test_every_retirement_date_in_models_toml_has_its_source_recorded() -> None:
    """A retires_at is a vendor's announcement: docs/model-retirements.md cites it."""
    with (CONTENT_DIR / "models.toml").open("rb") as file:
        models = tomllib.load(file)["models"]
    record = (ROOT / "docs" / "model-retirements.md").read_text()
    dated = [m for m in models if "retires_at" in m]
    assert dated
    for model in dated:
        line = next(
            (row for row in record.splitlines() if f"`{model['id']}`" in row), ""
        )
        assert model["retires_at"].isoformat() in line, model["id"]
        assert "https://" in line, model["id"]
