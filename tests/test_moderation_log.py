"""The moderation log: append-only days kept log_days, read back by the operator."""

from __future__ import annotations

import datetime as dt
import functools
import json
from pathlib import Path

from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.clock import midnight
from service.moderation.log import ModerationLog, Record, day_key
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, MakeClient, SettingsFactory
from .ports import free_port
from .processes import studio_environ
from .test_library import make_works
from .test_upstream_fal import KEY
from .upstream_fakes import FAL_ERRORS, FakeFal
from .upstream_jobs import (
    assert_books,
    finished,
    running_worker,
    submit,
    upstream_env,
)
from .workbench import sign_in, studio_command

DAY = dt.datetime(2026, 11, 27, 15, 30, tzinfo=dt.UTC)


async def test_a_day_is_kept_log_days_then_dropped(redis: Redis) -> None:
    """Each day's stream expires log_days after the day ends; reads stop there too."""
    log = ModerationLog(redis, 180, lambda: DAY)
    await log.append(Record(source="prompt", verdict="blocked", text="x"))
    expires = await redis.expiretime(day_key(DAY.date()))
    assert expires == int((midnight(DAY.date()) + dt.timedelta(days=181)).timestamp())
    later = ModerationLog(redis, 180, lambda: DAY + dt.timedelta(days=180))
    assert [r["text"] async for r in later.read()] == ["x"]
    gone = ModerationLog(redis, 180, lambda: DAY + dt.timedelta(days=181))
    assert [r async for r in gone.read(since=DAY.date())] == []


async def test_records_read_back_in_order_across_days_with_empty_fields_left_out(
    redis: Redis,
) -> None:
    """Oldest first; a record shows only the fields it has, its id and time first."""
    for offset, text in enumerate(["one", "two", "three"]):
        moment = DAY + dt.timedelta(days=offset)
        log = ModerationLog(redis, 180, functools.partial(lambda m: m, moment))
        await log.append(Record(source="prompt", verdict="blocked", text=text))
    today = ModerationLog(redis, 180, lambda: DAY + dt.timedelta(days=2))
    found = [r async for r in today.read()]
    assert [r["text"] for r in found] == ["one", "two", "three"]
    assert set(found[0]) == {"id", "at", "source", "verdict", "text"}
    since = [r["text"] async for r in today.read(since=(DAY + dt.timedelta(1)).date())]
    assert since == ["two", "three"]


async def test_the_operator_reads_the_log_by_account_and_tests_a_text(
    studio: MakeClient, mail_server: MailCatcher, redis_server: RedisServer
) -> None:
    """`studio moderation log [--since] [--account]`: JSON lines; `test` exits 1."""
    first, second = await studio(), await studio()
    me = await sign_in(first, mail_server)
    other = await sign_in(second, mail_server)
    for client, prompt in (
        (first, "child porn"),
        (second, "兒童色情"),
        (first, "儿童 色情"),
    ):
        response = await client.post(
            "/api/generations", json={"model": "seedream-4", "prompt": prompt}
        )
        assert response.status == 400
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    done = await studio_command("moderation", "log", environ=environ)
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [line["text"] for line in lines] == ["child porn", "兒童色情", "儿童 色情"]
    assert [line["account"] for line in lines] == [me["id"], other["id"], me["id"]]
    mine = await studio_command(
        "moderation", "log", "--account", me["email"], "--since",
        dt.datetime.now(dt.UTC).date().isoformat(), environ=environ,
    )  # fmt: skip
    assert [json.loads(line)["text"] for line in mine.stdout.splitlines()] == [
        "child porn",
        "儿童 色情",
    ]
    nobody = await studio_command(
        "moderation", "log", "--account", "nobody@example.com", environ=environ
    )
    assert nobody.returncode == 1
    refused = await studio_command(
        "moderation", "test", "ＣＨＩＬＤ-ＰＯＲＮ", environ=environ
    )
    assert refused.returncode == 1
    assert json.loads(refused.stdout) == {
        "verdict": "blocked",
        "list": "child porn",
        "provider": None,
    }
    allowed = await studio_command("moderation", "test", "a lamp", environ=environ)
    assert allowed.returncode == 0
    assert json.loads(allowed.stdout)["verdict"] == "allowed"
    # an operator command's answer is its stdout; stderr only says what went wrong
    assert refused.stderr == allowed.stderr == ""
    bad = await studio_command("moderation", "log", "--since", "x", environ=environ)
    assert bad.returncode == 2
    # A provider that does not answer: the list's verdict still counts; exit 3
    # says "not decided" where the list allows (1 keeps meaning "refused").
    down = {
        **environ,
        "STUDIO_MODERATION_PROVIDER": "tencent",
        "STUDIO_MODERATION_ACCESS_KEY_ID": "id",
        "STUDIO_MODERATION_ACCESS_KEY_SECRET": "secret",
        "STUDIO_MODERATION_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "STUDIO_MODERATION_TIMEOUT": "1",
    }
    for text, code, verdict in (("儿童色情", 1, "blocked"), ("a lamp", 3, "unknown")):
        done = await studio_command("moderation", "test", text, environ=down)
        line = json.loads(done.stdout)
        assert (done.returncode, line["verdict"]) == (code, verdict), done.stderr
        assert set(line["provider"]) == {"error"}


async def test_an_upstreams_own_refusal_is_logged_once(
    make_settings: SettingsFactory,
    aiohttp_client: AiohttpClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """A generation the upstream refused for its content: one record, one refund."""
    async with FakeFal(KEY) as fake:
        env = upstream_env(tmp_path, redis_server.url, "fal", fake.base_url, KEY)
        settings = make_settings(**env)
        client = await aiohttp_client(create_app(settings))
        me = await sign_in(client, mail_server)
        fake.refusal = (422, FAL_ERRORS["content_policy_violation"])
        async with running_worker(redis, settings):
            done = await finished(
                client, await submit(client, model="seedream-4", prompt="a thing")
            )
    assert (done["status"], done["error"]) == ("failed", "CONTENT_BLOCKED")
    await assert_books(client, 6, refunded=True)
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["account"], record["generation"]) == (
        "upstream",
        me["id"],
        done["id"],
    )
    assert record["text"] == "a thing"


async def test_an_operators_take_down_is_logged(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    """`studio works unpublish ID` is one record; a refused one is none."""
    client = await studio()
    me = await sign_in(client, mail_server)
    (work,) = await make_works(redis, tmp_path, me["id"], 1)
    assert (await client.post(f"/api/works/{work['id']}/publish")).status == 200
    environ = studio_environ(
        STUDIO_REDIS_URL=redis_server.url, STUDIO_SECRET_KEY=TEST_SECRET
    )
    done = await studio_command("works", "unpublish", work["id"], environ=environ)
    assert done.returncode == 0, done.stderr
    again = await studio_command("works", "unpublish", work["id"], environ=environ)
    assert again.returncode == 1
    (record,) = [r async for r in ModerationLog(redis, 180).read()]
    assert (record["source"], record["verdict"], record["work"]) == (
        "operator",
        "unpublish",
        work["id"],
    )
