"""Labels end to end: a real worker process on the demo upstream, then the square."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.labels.carriers import sniff
from service.store.embedded import MailCatcher

from .conftest import TEST_SECRET, Client, Env, MakeClient
from .labels_support import assert_one_label
from .workbench import sign_in, wait_for_status, worker_process

SUFFIX = {"image/png": "png", "video/mp4": "mp4"}


async def _generate(client: Client, env: Env, **body: Any) -> list[dict[str, Any]]:
    response = await client.post("/api/generations", json=body)
    assert response.status == 202, await response.text()
    generation = await response.json()
    with worker_process({**env, "STUDIO_SECRET_KEY": TEST_SECRET}):
        done = await wait_for_status(client, generation["id"], {"succeeded"}, 90)
    works: list[dict[str, Any]] = done["works"]
    return works


async def test_every_stored_file_is_labeled_and_publishing_keeps_the_bytes(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A PNG and an MP4 with their thumbnails: one verifying label each, the work's
    id as ProduceID; the square serves the very same bytes."""
    client = await studio(STUDIO_TRIAL_CREDITS="500")
    await sign_in(client, mail_server)
    works = await _generate(
        client, studio_env, model="seedream-4", prompt="a lamp", size="1024x1024"
    )
    works += await _generate(
        client, studio_env, model="kling-2-1", prompt="waves", size="1280x720"
    )
    stored = {}
    for work in works:
        media = await (await client.get(work["media_url"])).read()
        thumb = await (await client.get(work["thumb_url"])).read()
        assert_one_label(media, SUFFIX[work["content_type"]], TEST_SECRET, work["id"])
        assert_one_label(thumb, "webp", TEST_SECRET, work["id"])
        stored[work["id"]] = media
        published = await client.post(f"/api/works/{work['id']}/publish")
        assert published.status == 200
        shown = await (await client.get(f"/api/square/{work['id']}")).json()
        assert await (await client.get(shown["media_url"])).read() == media
    # Nothing unlabeled sits in the media store either.
    stored_files = _stored(Path(studio_env["STUDIO_MEDIA_DIR"]))
    assert len(stored_files) == 4
    for data in stored_files:
        assert_one_label(data, sniff(data) or "?", TEST_SECRET)


def _stored(media: Path) -> list[bytes]:
    return [path.read_bytes() for path in media.rglob("*") if path.is_file()]
