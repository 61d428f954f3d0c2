"""Labels on what a vendor sends: a JPEG, and an MP4 with sound, through the worker."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator
from pathlib import Path

import av
import pytest
from PIL import Image
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.labels.implicit import xmp_packet
from service.settings import Settings
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, Client, SettingsFactory
from .labels_support import assert_one_label, clip_with_audio
from .upstream_fakes import FakeFal
from .upstream_jobs import finished, running_worker, submit, upstream_env
from .workbench import sign_in

KEY = "fal-label-key-1b2c3d4e5f60718293a4b5c6"
THEIRS = {
    "Label": "1",
    "ContentProducer": "001191440300708461136T1XGW3",
    "ProduceID": "vendor-7",
    "ReservedCode1": "00",
    "ContentPropagator": "",
    "PropagateID": "",
    "ReservedCode2": "",
}


@pytest.fixture
async def fake() -> AsyncIterator[FakeFal]:
    async with FakeFal(KEY) as server:
        yield server


@pytest.fixture
def settings(
    make_settings: SettingsFactory, tmp_path: Path, redis_server: RedisServer,
    fake: FakeFal,
) -> Settings:  # fmt: skip
    return make_settings(
        **upstream_env(tmp_path, redis_server.url, "fal", fake.base_url, KEY)
    )


@pytest.fixture
async def client(
    aiohttp_client: AiohttpClient, settings: Settings, mail_server: MailCatcher,
    redis: Redis,
) -> Client:  # fmt: skip
    client = await aiohttp_client(create_app(settings))
    await sign_in(client, mail_server)
    return client


async def test_a_vendors_jpeg_is_stored_labeled_with_our_label_only(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis
) -> None:
    """The JPEG arrives with the vendor's own TC260 label; the stored JPEG and its
    thumbnail carry one label each, ours, naming the work."""
    buffer = io.BytesIO()
    Image.new("RGB", (640, 480), (90, 140, 200)).save(
        buffer, format="JPEG", xmp=xmp_packet(THEIRS, None)
    )
    jpeg = buffer.getvalue()
    fake.result = {
        "images": [
            {
                "url": fake.serve("a.jpg", jpeg, "image/jpeg"),
                "content_type": "image/jpeg",
                "width": 640,
                "height": 480,
            }
        ],
        "seed": 1,
        "has_nsfw_concepts": [False],
    }
    async with running_worker(redis, settings):
        done = await finished(
            client, await submit(client, model="seedream-4", prompt="x")
        )
    assert done["status"] == "succeeded", done
    (work,) = done["works"]
    assert work["content_type"] == "image/jpeg"
    media = await (await client.get(work["media_url"])).read()
    label = assert_one_label(media, "jpg", TEST_SECRET, work["id"])
    assert label["ContentProducer"] != THEIRS["ContentProducer"]
    thumb = await (await client.get(work["thumb_url"])).read()
    assert_one_label(thumb, "webp", TEST_SECRET, work["id"])


async def test_a_vendors_clip_keeps_its_sound_and_gets_our_label(
    client: Client, fake: FakeFal, settings: Settings, redis: Redis, tmp_path: Path
) -> None:
    """An MP4 with an AAC track and its own AIGC key: stored with the track and
    our one label; its poster is labeled too."""
    clip = clip_with_audio(tmp_path / "vendor.mp4")
    fake.result = {
        "video": {
            "url": fake.serve("c.mp4", clip, "video/mp4"),
            "content_type": "video/mp4",
        }
    }
    async with running_worker(redis, settings):
        generation = await submit(client, model="kling-2-1", prompt="waves")
        done = await finished(client, generation, 60)
    assert done["status"] == "succeeded", done
    (work,) = done["works"]
    media = await (await client.get(work["media_url"])).read()
    assert_one_label(media, "mp4", TEST_SECRET, work["id"])
    with av.open(io.BytesIO(media), mode="r") as container:
        (audio,) = container.streams.audio
        assert audio.codec_context.name == "aac"
        assert sum(1 for p in container.demux(audio) if p.size) > 50
    poster = await (await client.get(work["thumb_url"])).read()
    assert_one_label(poster, "webp", TEST_SECRET, work["id"])


async def test_an_output_that_cannot_be_labeled_fails_and_stores_nothing(
    client: Client,
    fake: FakeFal,
    settings: Settings,
    redis: Redis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two images, the second a truncated PNG (its magic is right, its pixels are
    not there): UPSTREAM_FAILED, refunded, and not even the first is stored."""
    whole = io.BytesIO()
    Image.new("RGB", (64, 64), "teal").save(whole, format="PNG")
    cut = whole.getvalue()[: len(whole.getvalue()) // 2]
    fake.result = {
        "images": [
            {"url": fake.serve(name, body, "image/png"), "content_type": "image/png"}
            for name, body in (("a.png", whole.getvalue()), ("b.png", cut))
        ],
        "seed": 1,
        "has_nsfw_concepts": [False, False],
    }
    async with running_worker(redis, settings):
        generation = await submit(client, model="seedream-4", prompt="x", count=2)
        done = await finished(client, generation)
    assert (done["status"], done["error"], done["refunded"]) == (
        "failed",
        "UPSTREAM_FAILED",
        True,
    )
    assert "an output could not be labeled" in caplog.text
    media = settings.workbench.media_dir
    assert not media.exists() or not [p for p in media.rglob("*") if p.is_file()]
