"""The `comfyui` protocol against a fake ComfyUI server on loopback, through workers."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.content import CONTENT_DIR, load_content
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer
from service.studio.keys import GENERATIONS, JOBS
from service.studio.upstreams.tasks import memo_key

from .conftest import Client, MakeClient, SettingsFactory
from .upstream_fakes import Canned
from .upstream_jobs import (
    assert_books,
    finished,
    running_worker,
    submit,
    until,
    upstream_env,
)
from .vendor_fakes import FakeComfyUI
from .workbench import sign_in, wait_for_status, worker_process

MODEL, PRICE = "sdxl-comfyui", 2


@pytest.fixture
async def fake() -> AsyncIterator[FakeComfyUI]:
    """A ComfyUI server on loopback."""
    async with FakeComfyUI() as server:
        yield server


@pytest.fixture
def env(tmp_path: Path, redis_server: RedisServer, fake: FakeComfyUI) -> dict[str, str]:
    """Settings of the app and its workers: `comfyui` is the fake (no key)."""
    return upstream_env(tmp_path, redis_server.url, "comfyui", fake.base_url, "")


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


async def test_the_workflow_runs_with_our_fields_under_the_jobs_id(
    client: Client, fake: FakeComfyUI, env: dict[str, str]
) -> None:
    """The row's inputs set on their nodes; prompt_id = the job; two PNGs stored."""
    fake.hold = True
    with worker_process(env):
        generation = await submit(
            client, model=MODEL, prompt="a lighthouse at dusk", negative_prompt="blur",
            seed=42, count=2, size="1344x768",
        )  # fmt: skip
        await until(
            lambda: any(p.step == fake.steps - 1 for p in fake.prompts.values())
        )
        await asyncio.sleep(0.3)
        body = await (await client.get(f"/api/generations/{generation['id']}")).json()
        assert body["status"] == "running"
        assert 0.7 < body["progress"] < 1.0  # 9 of 10 steps, heard on the websocket
        fake.hold = False
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    (prompt,) = fake.prompts.values()
    assert prompt.id == prompt.client_id == generation["id"]
    workflow = load_content().workflows["sdxl_text_to_image.json"]
    graph = prompt.graph
    assert graph["6"]["inputs"]["text"] == "a lighthouse at dusk"
    assert graph["7"]["inputs"]["text"] == "blur"
    assert graph["3"]["inputs"]["seed"] == 42
    assert graph["5"]["inputs"] == {"width": 1344, "height": 768, "batch_size": 2}
    assert graph["4"] == workflow["4"]  # the rest of the graph as the file has it
    assert [w["content_type"] for w in done["works"]] == ["image/png"] * 2
    await assert_books(client, 2 * PRICE, refunded=False)


@pytest.mark.parametrize("memo_lost", [False, True], ids=["memo", "memo-lost"])
async def test_a_sigkilled_worker_never_makes_comfyui_run_the_job_twice(
    client: Client, fake: FakeComfyUI, env: dict[str, str], redis: Redis,
    memo_lost: bool,
) -> None:  # fmt: skip
    """The next worker polls the same prompt; even without the memo, /queue has it."""
    fake.hold = True
    with worker_process(env) as first:
        generation = await submit(client, model=MODEL, prompt="slow")
        await until(lambda: any(p.step >= 3 for p in fake.prompts.values()))
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    if memo_lost:
        await redis.delete(memo_key(generation["id"]))
    fake.hold = False
    with worker_process(env):
        done = await finished(client, generation, within=60)
    assert done["status"] == "succeeded", done
    assert fake.creates == 1
    await assert_books(client, PRICE, refunded=False)


async def _cancel_unheard(client: Client, gid: str) -> None:
    """Cancel in the store, refunded as the endpoint would, but nobody is told."""
    me = await (await client.get("/api/me")).json()
    outcome, _ = await client.app[GENERATIONS].settle(me["id"], gid, "cancel")
    assert outcome == "OK"


async def test_a_cancel_whose_message_the_worker_missed_still_deletes_the_prompt(
    client: Client, fake: FakeComfyUI, env: dict[str, str]
) -> None:
    """Canceled in the store with no message sent: the worker's own look stops it."""
    fake.queued = True
    with worker_process(env):
        generation = await submit(client, model=MODEL, prompt="never mind")
        await until(lambda: bool(fake.prompts))
        await _cancel_unheard(client, generation["id"])
        (prompt,) = fake.prompts.values()
        await until(lambda: prompt.state == "deleted", within=10)
    await assert_books(client, PRICE, refunded=True)


async def test_a_cancel_while_the_prompt_is_being_queued_still_deletes_it(
    client: Client, fake: FakeComfyUI, env: dict[str, str]
) -> None:
    """ComfyUI has queued the prompt but not yet answered when the owner cancels."""
    fake.queued = True
    fake.answer_delay = 2.0
    with worker_process(env):
        generation = await submit(client, model=MODEL, prompt="never mind")
        await until(lambda: bool(fake.prompts))
        await client.post(f"/api/generations/{generation['id']}/cancel")
        await wait_for_status(client, generation["id"], {"canceled"})
        (prompt,) = fake.prompts.values()
        await until(lambda: prompt.state == "deleted", within=10)
    await assert_books(client, PRICE, refunded=True)


async def test_a_late_cancel_message_does_not_cut_short_telling_comfyui_to_stop(
    client: Client, fake: FakeComfyUI, env: dict[str, str]
) -> None:
    """The worker's own look is telling ComfyUI when the owner's message lands."""
    fake.queued = True
    with worker_process(env):
        generation = await submit(client, model=MODEL, prompt="never mind")
        await until(lambda: bool(fake.prompts))
        fake.delete_delay = 1.0
        await _cancel_unheard(client, generation["id"])
        await until(lambda: bool(fake.api_requests("/queue")), within=10)
        await client.app[JOBS].cancel(generation["id"])  # the message, late
        (prompt,) = fake.prompts.values()
        await until(
            lambda: prompt.state == "deleted" and bool(fake.api_requests("/interrupt")),
            within=10,
        )
    await assert_books(client, PRICE, refunded=True)


@pytest.mark.parametrize("where", ["queued", "running"])
async def test_cancel_deletes_a_queued_prompt_or_interrupts_a_running_one(
    client: Client, fake: FakeComfyUI, env: dict[str, str], where: str
) -> None:
    """POST /queue {"delete"} and /interrupt {"prompt_id"}: it stops; one refund."""
    fake.queued = where == "queued"
    fake.hold = where == "running"
    with worker_process(env):
        generation = await submit(client, model=MODEL, prompt="never mind")
        await until(lambda: bool(fake.prompts))
        if where == "running":
            await until(lambda: any(p.step >= 2 for p in fake.prompts.values()))
        await client.post(f"/api/generations/{generation['id']}/cancel")
        await wait_for_status(client, generation["id"], {"canceled"})
        (prompt,) = fake.prompts.values()
        await until(
            lambda: (
                prompt.state in ("deleted", "interrupted")
                and bool(fake.api_requests("/interrupt"))
            )
        )
    deleted = fake.api_requests("/queue")[-1].json()
    assert deleted == {"delete": [generation["id"]]}
    (interrupt,) = fake.api_requests("/interrupt")
    assert interrupt.json() == {"prompt_id": generation["id"]}
    assert prompt.state == ("deleted" if where == "queued" else "interrupted")
    await assert_books(client, PRICE, refunded=True)


@pytest.mark.parametrize(
    "fault",
    [
        "OutOfMemoryError",
        Canned(400, {"error": {"type": "prompt_outputs_failed_validation",
                               "message": "Prompt outputs failed validation",
                               "details": "", "extra_info": {}},
                     "node_errors": {"4": {"errors": [{"type": "value_not_in_list"}],
                                           "class_type": "CheckpointLoaderSimple"}}}),
        Canned(200, "<html>proxy</html>", {"Content-Type": "text/html"}),
    ],
    ids=["execution-error", "invalid-graph", "unreadable"],
)  # fmt: skip
async def test_a_failed_run_or_refused_graph_fails_upstream_failed_once(
    client: Client, fake: FakeComfyUI, settings: Settings, redis: Redis,
    fault: str | Canned,
) -> None:  # fmt: skip
    """execution_error, a 400 with node_errors, or a non-JSON answer: refunded once."""
    if isinstance(fault, str):
        fake.failure = fault
    else:
        fake.script(fault)
    async with running_worker(redis, settings):
        done = await finished(client, await submit(client, model=MODEL, prompt="p"))
    assert (done["status"], done["error"]) == ("failed", "UPSTREAM_FAILED")
    assert fake.creates == (1 if isinstance(fault, str) else 0)
    await assert_books(client, PRICE, refunded=True)


async def test_a_busy_server_is_retried_and_the_prompt_queued_once(
    client: Client, fake: FakeComfyUI, settings: Settings, redis: Redis
) -> None:
    """A 503 at /prompt and at /history: retried; one prompt, one charge."""
    fake.script(Canned(503, "busy", {"Content-Type": "text/plain"}))
    async with running_worker(redis, settings):
        generation = await submit(client, model=MODEL, prompt="p")
        await until(lambda: bool(fake.prompts))
        fake.script(Canned(502, "bad gateway", {"Content-Type": "text/plain"}))
        done = await finished(client, generation)
    assert done["status"] == "succeeded", done
    assert fake.creates == 1
    await assert_books(client, PRICE, refunded=False)


async def test_the_comfyui_row_is_off_until_its_base_url_is_set(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """By default (no base_url) the model is unavailable; the demo still runs it."""
    client = await studio(STUDIO_DEMO_UPSTREAM="0")
    await sign_in(client, mail_server)
    models = {
        m["id"]: m for m in (await (await client.get("/api/models")).json())["models"]
    }
    assert models[MODEL]["available"] is False
    response = await client.post(
        "/api/generations", json={"model": MODEL, "prompt": "a lamp"}
    )
    assert (response.status, (await response.json())["error"]) == (
        400, "MODEL_UNAVAILABLE",
    )  # fmt: skip
    demo = await studio()
    models = {
        m["id"]: m for m in (await (await demo.get("/api/models")).json())["models"]
    }
    assert models[MODEL]["available"] is True


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ('{ prompt = "6.text", seed = "3.noise" }', "no such input"),
        ('{ prompt = "60.text" }', "no such input"),
        ('{ prompt = "6.text", steps = "3.steps" }', "unknown inputs"),
    ],
)
def test_a_row_mapping_a_field_to_no_node_input_is_refused_at_load(
    tmp_path: Path, inputs: str, message: str
) -> None:
    """Every mapped "<node>.<input>" must exist in the workflow file."""
    directory = tmp_path / "content"
    shutil.copytree(CONTENT_DIR, directory)
    models = directory / "models.toml"
    text = models.read_text()
    start = text.index("inputs = {", text.index('id = "sdxl-comfyui"'))
    end = text.index("\n", start)
    models.write_text(text[:start] + f"inputs = {inputs}" + text[end:])
    with pytest.raises(ValueError, match=message):
        load_content(directory)
