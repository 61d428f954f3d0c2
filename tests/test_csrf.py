"""Cross-origin state changes are refused, sign-in included."""

from __future__ import annotations

import pytest

from .conftest import Client

BODY = {"email": "csrf@example.com"}


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:8080"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:8081"},
    ],
)
@pytest.mark.parametrize(
    "path", ["/api/auth/code", "/api/auth/verify", "/api/auth/logout"]
)
async def test_foreign_requests_are_refused(
    client: Client, headers: dict[str, str], path: str
) -> None:
    """403 CROSS_ORIGIN before the body is even read."""
    response = await client.post(path, json=BODY, headers=headers)
    assert response.status == 403
    assert await response.json() == {"error": "CROSS_ORIGIN"}


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Sec-Fetch-Site": "same-origin"},
        {"Sec-Fetch-Site": "none"},
        {"Origin": "http://127.0.0.1:8080"},
        {"Sec-Fetch-Site": "same-origin", "Origin": "http://127.0.0.1:8080"},
    ],
)
async def test_same_origin_and_non_browser_requests_pass(
    client: Client, headers: dict[str, str]
) -> None:
    """Our own front end and curl get through to the handler."""
    response = await client.post("/api/auth/logout", headers=headers)
    assert response.status == 204


async def test_reads_are_not_checked(client: Client) -> None:
    """GET never changes state, so it is never refused as cross-origin."""
    response = await client.get("/api/me", headers={"Sec-Fetch-Site": "cross-site"})
    assert response.status == 401
