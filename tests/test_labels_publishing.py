"""Labels end to end: a real worker process on the demo upstream, then the square."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from service.labels.carriers import sniff
from service.labels.credentials import read_credentials
from service.labels.local_ca import make_chain
from service.store.embedded import MailCatcher

from .conftest import TEST_SECRET, Client, Env, MakeClient
from .labels_support import assert_one_label
from .workbench import sign_in, wait_for_status, worker_process

SUFFIX = {"image/png": "png", "video/mp4": "mp4"}


async def _generate(client: Client, env: Env, **body: Any) -> list[dict[str, Any]]:
    response = await client.post("/api/generations", json=body)
    assert response.status == 202, await response.text()
    generation = await response.json()
    with worker_process(env):
        done = await wait_for_status(client, generation["id"], {"succeeded"}, 90)
    works: list[dict[str, Any]] = done["works"]
    return works


async def test_every_stored_file_is_labeled_and_publishing_keeps_the_bytes(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env
) -> None:
    """A PNG and an MP4 with their thumbnails: one verifying label each, the work's
    id as ProduceID, a trusted C2PA manifest; the square serves the same bytes."""
    client = await studio(STUDIO_TRIAL_CREDITS="500")
    await sign_in(client, mail_server)
    chain, key, ca = make_chain(days=30)
    folder = Path(studio_env["STUDIO_MEDIA_DIR"]).parent
    (folder / "chain.pem").write_bytes(chain)
    (folder / "key.pem").write_bytes(key)
    worker_env = {
        **studio_env,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_LABELS_C2PA_CERT": str(folder / "chain.pem"),
        "STUDIO_LABELS_C2PA_KEY": str(folder / "key.pem"),
    }
    works = await _generate(
        client, worker_env, model="seedream-4", prompt="a lamp", size="1024x1024"
    )
    works += await _generate(
        client, worker_env, model="kling-2-1", prompt="waves", size="1280x720"
    )
    stored = {}
    for work in works:
        media = await (await client.get(work["media_url"])).read()
        thumb = await (await client.get(work["thumb_url"])).read()
        assert_one_label(media, SUFFIX[work["content_type"]], TEST_SECRET, work["id"])
        assert_one_label(thumb, "webp", TEST_SECRET, work["id"])
        kind = SUFFIX[work["content_type"]]
        for data, extension in ((media, kind), (thumb, "webp")):
            signed = read_credentials(data, extension, ca.decode())
            assert signed is not None
            assert (signed.state, signed.manifests) == ("Trusted", 1)
        stored[work["id"]] = media
        published = await client.post(f"/api/works/{work['id']}/publish")
        assert published.status == 200
        shown = await (await client.get(f"/api/square/{work['id']}")).json()
        assert await (await client.get(shown["media_url"])).read() == media
        page = await (await client.get(f"/square/{work['id']}")).text()
        assert '<span class="ai-badge"' in page
    # Nothing unlabeled sits in the media store either.
    stored_files = _stored(Path(studio_env["STUDIO_MEDIA_DIR"]))
    assert len(stored_files) == 4
    for data in stored_files:
        assert_one_label(data, sniff(data) or "?", TEST_SECRET)


def _stored(media: Path) -> list[bytes]:
    return [path.read_bytes() for path in media.rglob("*") if path.is_file()]


async def test_the_terms_explain_the_labels_in_both_languages(client: Client) -> None:
    """What the labels look like, where they are, and that removing them is
    forbidden (the Measures §8, §10), in Chinese and in English."""
    terms = await (await client.get("/terms")).text()
    for said in (
        "显式标识",
        "画面右下角的“AI生成”字样",
        "不低于画面最短边的 5%",
        "视频的每一帧",
        "隐式标识",
        "XMP",
        "不得恶意删除、篡改、伪造、隐匿上述标识",
        "in the bottom-right corner",
        "Every frame of a video carries it",
        "metadata",
        "may maliciously remove, alter, forge or hide these labels",
        "C2PA 内容凭证",
        "Content Credentials (C2PA)",
    ):
        assert said in terms, said
