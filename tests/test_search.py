"""Search my works and generations by prompt: substrings, any case, Chinese."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from service.store.embedded import MailCatcher

from .conftest import Client, MakeClient
from .test_library import make_works
from .workbench import sign_in


async def _all(client: Client, path: str, **query: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cursor = ""
    while True:
        params = {**query, "limit": "2", **({"cursor": cursor} if cursor else {})}
        response = await client.get(path, params=params)
        assert response.status == 200, await response.text()
        body = await response.json()
        items += body["items"]
        if not body["next_cursor"]:
            return items
        cursor = body["next_cursor"]


async def test_a_chinese_word_is_found_inside_my_prompts_and_not_in_others(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """灯笼 inside 一盏红色的灯笼: found; someone else's lantern is not mine."""
    me, other = await studio(), await studio()
    mine = await sign_in(me, mail_server)
    theirs = await sign_in(other, mail_server)
    lanterns = await make_works(redis, tmp_path, mine["id"], 3, prompt="一盏红色的灯笼")
    await make_works(redis, tmp_path, mine["id"], 4, prompt="a quiet harbour")
    more = await make_works(redis, tmp_path, mine["id"], 2, prompt="灯笼 at night")
    await make_works(redis, tmp_path, theirs["id"], 2, prompt="一盏红色的灯笼")
    found = await _all(me, "/api/works", q="灯笼")
    assert [w["id"] for w in found] == [w["id"] for w in reversed(lanterns + more)]
    assert await _all(me, "/api/works", q="红色的灯") == (
        await _all(me, "/api/works", q="一盏")
    )
    assert await _all(me, "/api/works", q="蓝色") == []
    await me.delete(f"/api/works/{lanterns[0]['id']}")
    assert len(await _all(me, "/api/works", q="灯笼")) == 4


async def test_search_ignores_case_and_keeps_the_other_parameters(
    studio: MakeClient, mail_server: MailCatcher, redis: Redis, tmp_path: Path
) -> None:
    """HARBOUR finds harbour; favorite=true narrows it; cursors page it."""
    me = await studio()
    mine = await sign_in(me, mail_server)
    works = await make_works(redis, tmp_path, mine["id"], 5, prompt="A Quiet Harbour")
    await me.put(f"/api/works/{works[1]['id']}/favorite")
    assert len(await _all(me, "/api/works", q="HARBOUR")) == 5
    favorites = await _all(me, "/api/works", q="harbour", favorite="true")
    assert [w["id"] for w in favorites] == [works[1]["id"]]


async def test_generations_are_searched_by_their_prompt(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """Only my generations whose prompt holds q, newest first, across pages."""
    me = await studio(STUDIO_JOBS_PER_USER="20")
    await sign_in(me, mail_server)
    ids = []
    for prompt in ("红灯笼 Festival", "a boat", "灯笼与月亮", "festival LIGHTS"):
        response = await me.post(
            "/api/generations", json={"model": "seedream-4", "prompt": prompt}
        )
        ids.append((await response.json())["id"])
    found = await _all(me, "/api/generations", q="festival")
    assert [g["id"] for g in found] == [ids[3], ids[0]]
    found = await _all(me, "/api/generations", q="灯笼")
    assert [g["id"] for g in found] == [ids[2], ids[0]]


async def test_a_query_of_no_or_too_many_characters_names_q(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """1 to 100 characters; anything else is a 400 with field q."""
    me = await studio()
    await sign_in(me, mail_server)
    for path in ("/api/works", "/api/generations"):
        for q in ("", "x" * 101):
            response = await me.get(path, params={"q": q})
            assert response.status == 400, (path, q)
            assert await response.json() == {"error": "BAD_REQUEST", "field": "q"}
        assert (await me.get(path, params={"q": "x" * 100})).status == 200
