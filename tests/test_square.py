"""The square: published works, newest first, cursor pages, no author data."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from service.keys import SQUARE
from service.square.feed import SquareStore, Work

from .conftest import Client


async def _publish(store: SquareStore, count: int) -> list[Work]:
    return [
        await store.publish(
            kind="image" if i % 2 else "video",
            model="Seedream 4.0",
            prompt=f"work {i}",
            media_url=f"https://cdn.example.com/{i}.png",
            width=1024,
            height=768,
        )
        for i in range(count)
    ]


async def test_pages_walk_every_work_newest_first_exactly_once(client: Client) -> None:
    """Cursor pages cover the feed with no gap and no repeat."""
    works = await _publish(client.app[SQUARE], 7)
    seen: list[str] = []
    cursor = None
    for _ in range(10):
        query = {"limit": "3", **({"cursor": cursor} if cursor else {})}
        response = await client.get("/api/square", params=query)
        assert response.status == 200
        body = await response.json()
        seen += [item["id"] for item in body["items"]]
        cursor = body["next_cursor"]
        if cursor is None:
            break
    assert seen == [work.id for work in reversed(works)]


async def test_a_work_carries_no_personal_data(client: Client) -> None:
    """No e-mail, no author id: only the work."""
    (work,) = await _publish(client.app[SQUARE], 1)
    body = await (await client.get(f"/api/square/{work.id}")).json()
    assert set(body) == {
        "id", "kind", "model", "prompt", "media_url", "width", "height", "published_at",
    }  # fmt: skip
    assert "@" not in str(body)


async def test_unknown_and_unpublished_works_are_404(client: Client) -> None:
    """Only published works can be read."""
    store = client.app[SQUARE]
    (work,) = await _publish(store, 1)
    assert (await client.get(f"/api/square/{work.id}")).status == 200
    assert await store.unpublish(work.id)
    for path in (f"/api/square/{work.id}", "/api/square/nope", "/api/square/..%2f"):
        response = await client.get(path)
        assert response.status == 404
        assert await response.json() == {"error": "NOT_FOUND"}
    listed = await (await client.get("/api/square")).json()
    assert work.id not in [item["id"] for item in listed["items"]]


@pytest.mark.parametrize(
    "query",
    [
        {"limit": "0"},
        {"limit": "51"},
        {"limit": "-1"},
        {"limit": "ten"},
        {"limit": "²"},  # a digit to str.isdigit(), not to int()
        {"cursor": "!!!"},
        {"cursor": "djI6MTA"},  # v2:10
        {"cursor": "djE6LTE"},  # v1:-1
        {"cursor": "djE6YQ"},  # v1:a
        {"unknown": "1"},
    ],
)
async def test_bad_limits_and_cursors_are_400(
    client: Client, query: dict[str, str]
) -> None:
    """Limit 1-50, cursors that we issued, nothing else."""
    response = await client.get("/api/square", params=query)
    assert response.status == 400
    assert await response.json() == {"error": "BAD_REQUEST"}


async def test_square_responses_are_private_to_the_client(client: Client) -> None:
    """Per-client rate headers never go into a shared cache."""
    response = await client.get("/api/square")
    assert response.headers["Cache-Control"].startswith("private")
    assert "RateLimit" in response.headers


async def test_publishing_is_one_atomic_step_in_one_slot(redis: Redis) -> None:
    """The feed, the sequence and the work share one hash tag."""
    store = SquareStore(redis)
    (work,) = await _publish(store, 1)
    keys = [key.decode() async for key in redis.scan_iter("studio:square:*")]
    assert len(keys) == 3
    assert all("{square}" in key for key in keys)
    assert await store.get(work.id) == work
