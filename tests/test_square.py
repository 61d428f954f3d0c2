"""The square: published works, newest first, cursor pages, no author data."""

from __future__ import annotations

import uuid
from typing import Literal

import pytest
from redis.asyncio import Redis

from service.square.feed import SQUARE, SquareStore, Work

from .conftest import Client


def sample_work(index: int) -> Work:
    """A work as the library would publish it."""
    kind: Literal["image", "video"] = "image" if index % 2 else "video"
    return Work(
        id=f"w{index}x{uuid.uuid4().hex[:8]}",
        kind=kind,
        model="seedream-4",
        prompt=f"work {index}",
        media_url=f"/media/{index}.png",
        thumb_url=f"/media/{index}.webp",
        width=1024,
        height=768,
        content_type="image/png" if kind == "image" else "video/mp4",
        published_at="2026-11-23T10:00:00Z",
        duration=5.0 if kind == "video" else None,
    )


async def _publish(store: SquareStore, count: int) -> list[Work]:
    return [await store.publish(sample_work(i), owner="someone") for i in range(count)]


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


async def test_no_query_is_the_first_page_of_the_newest_twenty(client: Client) -> None:
    """The bare path (the square's most asked page) means the spelled-out defaults."""
    works = await _publish(client.app[SQUARE], 23)
    bare = await client.get("/api/square")
    spelled = await client.get("/api/square", params={"sort": "new", "limit": "20"})
    assert bare.status == spelled.status == 200
    body = await bare.json()
    assert body == await spelled.json()
    assert [item["id"] for item in body["items"]] == [w.id for w in works[::-1][:20]]
    assert body["next_cursor"] is not None


async def test_a_work_carries_no_personal_data(client: Client) -> None:
    """No e-mail, no author id: only the work."""
    (work,) = await _publish(client.app[SQUARE], 1)
    body = await (await client.get(f"/api/square/{work.id}")).json()
    assert set(body) == {
        "id", "kind", "model", "prompt", "media_url", "thumb_url", "width", "height",
        "duration", "content_type", "published_at", "favorites",
    }  # fmt: skip
    assert "@" not in str(body)
    assert "someone" not in str(body)


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
        {"sort": "old"},
        {"kind": "audio"},
        {"kind": ""},
        {"sort": "top", "cursor": "djE6MTA"},  # a `new` cursor on `top`
    ],
)
async def test_bad_limits_and_cursors_are_400(
    client: Client, query: dict[str, str]
) -> None:
    """Limit 1-50, cursors that we issued, nothing else."""
    response = await client.get("/api/square", params=query)
    assert response.status == 400
    assert (await response.json())["error"] == "BAD_REQUEST"


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
    # seq, version, work, meta, feed, feed:kind, top, top:kind
    assert len(keys) == 8
    assert all("{square}" in key for key in keys)
    assert await store.get(work.id) == work
