"""Query parameters: numbers are read with a bound on their length before int()."""

from __future__ import annotations

import logging

import pytest

from service.store.embedded import MailCatcher

from .conftest import MakeClient
from .logs import troubles
from .workbench import sign_in

LISTS = (
    "/api/generations",
    "/api/works",
    "/api/favorites",
    "/api/credits",
    "/api/orders",
    "/api/square",
)


@pytest.mark.parametrize("digits", [19, 4_300, 4_301, 8_000])
async def test_a_limit_of_any_length_is_a_400_naming_it_on_every_list(
    studio: MakeClient,
    mail_server: MailCatcher,
    caplog: pytest.LogCaptureFixture,
    digits: int,
) -> None:
    """Past 4,300 digits int() refuses the string: the length is checked first."""
    client = await studio()
    await sign_in(client, mail_server)
    caplog.set_level(logging.INFO)
    for path in LISTS:
        response = await client.get(f"{path}?limit={'1' * digits}")
        assert response.status == 400, path
        assert await response.json() == {"error": "BAD_REQUEST", "field": "limit"}
    assert troubles(caplog) == []


@pytest.mark.parametrize(
    ("path", "cursor"),
    [
        ("/api/generations", "g"),
        ("/api/works", "w"),
        ("/api/favorites", "f"),
        ("/api/credits", "e"),
        ("/api/orders", "o"),
    ],
)
async def test_a_cursor_of_any_length_is_a_400_naming_it(
    studio: MakeClient,
    mail_server: MailCatcher,
    caplog: pytest.LogCaptureFixture,
    path: str,
    cursor: str,
) -> None:
    """The number in a cursor is bounded the same way, whatever its prefix."""
    client = await studio()
    await sign_in(client, mail_server)
    caplog.set_level(logging.INFO)
    for number in ("9" * 19, "9" * 4_301, "²", "0"):
        response = await client.get(f"{path}?cursor={cursor}{number}")
        assert response.status == 400, (path, number[:5])
        assert await response.json() == {"error": "BAD_REQUEST", "field": "cursor"}
    assert troubles(caplog) == []


async def test_limits_in_bounds_still_page(studio: MakeClient) -> None:
    """1 and 50 are taken; 0, 51 and leading signs are not."""
    client = await studio()
    for limit, status in (
        ("1", 200),
        ("50", 200),
        ("0", 400),
        ("51", 400),
        ("+5", 400),
    ):
        response = await client.get(f"/api/square?limit={limit}")
        assert response.status == status, limit
