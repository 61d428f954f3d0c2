"""What a killed run stored is deleted once its generation is final; nothing else."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

from redis.asyncio import Redis

from service.store.embedded import MailCatcher
from service.studio.media.pending import PENDING, Note, PendingMedia

from .conftest import Env, MakeClient
from .moderation_fakes import APP_ID, SECRET_ID, SECRET_KEY, FakeTencent
from .workbench import ledger, sign_in, wait_for_status, worker_process


def _files(directory: Path) -> set[str]:
    return {p.name for p in directory.rglob("*") if p.is_file()}


async def test_a_worker_killed_between_storing_and_settling_leaves_no_file_behind(
    studio: MakeClient, mail_server: MailCatcher, studio_env: Env, redis: Redis
) -> None:
    """SIGKILL while a stored output waits for the moderation verdict: the next
    worker makes the work again, and the killed run's files are deleted once the
    generation has succeeded; the work's own stay, and it was charged once."""
    async with FakeTencent() as fake:
        env = {
            **studio_env,
            "STUDIO_MODERATION_PROVIDER": fake.name,
            "STUDIO_MODERATION_ACCESS_KEY_ID": SECRET_ID,
            "STUDIO_MODERATION_ACCESS_KEY_SECRET": SECRET_KEY,
            "STUDIO_MODERATION_ENDPOINT": fake.base_url,
            "STUDIO_MODERATION_APP_ID": APP_ID,
        }
        client = await studio(**env)
        await sign_in(client, mail_server)
        fake.hang_images = True
        response = await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": "a lamp"}
        )
        assert response.status == 202, await response.text()
        gid = (await response.json())["id"]
        media = Path(env["STUDIO_MEDIA_DIR"])
        with worker_process(env) as doomed:
            deadline = time.monotonic() + 30
            while not fake.images():  # stored, and being checked
                assert time.monotonic() < deadline, "no output was checked"
                await asyncio.sleep(0.05)
            left = _files(media)
            assert len(left) == 2  # the picture and its thumbnail
            assert await redis.zcard(PENDING) == 2  # each noted before it was put
            os.killpg(doomed.pid, signal.SIGKILL)
            doomed.wait()
        fake.hang_images = False
        with worker_process(env):
            done = await wait_for_status(client, gid, {"succeeded"}, 30)
            (work,) = done["works"]
            kept = {Path(work["media_url"]).name, Path(work["thumb_url"]).name}
            assert not kept & left  # made again, under new keys
            deadline = time.monotonic() + 20
            while _files(media) != kept:  # a janitor's sweep, a lease later
                assert time.monotonic() < deadline, f"left behind: {_files(media)}"
                await asyncio.sleep(0.1)
        assert await redis.zcard(PENDING) == 0
    assert [entry["kind"] for entry in await ledger(client)] == ["grant", "debit"]


async def test_a_note_is_read_back_and_a_stray_member_is_dropped(redis: Redis) -> None:
    """Notes round-trip through the set; one this module did not write goes."""
    pending = PendingMedia(redis)
    await redis.delete(PENDING)
    note = Note("acct1", "gen1", "", "ab/cd.webp")
    await pending.note([note])
    await redis.zadd(PENDING, {"not-a-note": 0})
    assert await pending.stale(time.time() + 1) == [note]
    assert await redis.zrange(PENDING, 0, -1) == [note.member.encode()]
    await pending.settled([note])
    assert await redis.zcard(PENDING) == 0
