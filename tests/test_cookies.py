"""Our cookies are read without parsing the whole header; big headers are refused."""

from __future__ import annotations

import time
import uuid

import pytest
from aiohttp import web
from multidict import CIMultiDict, CIMultiDictProxy

from service.auth.cookies import (
    MAX_COOKIE_HEADER_BYTES,
    MAX_VALUE_CHARS,
    cookie_header_size,
    find_cookie,
    read_cookie,
)
from service.settings import PACKAGE
from service.store.embedded import MailCatcher

from .conftest import Client, latest_code

NAME = "studio_session"


def _headers(*cookies: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict([("Cookie", value) for value in cookies]))


async def _sign_in(client: Client, mail_server: MailCatcher) -> str:
    """Sign in through the real flow; return the session token, jar emptied."""
    email = f"person-{uuid.uuid4().hex[:10]}@example.com"
    assert (await client.post("/api/auth/code", json={"email": email})).status == 200
    code = latest_code(mail_server, email)
    verify = await client.post("/api/auth/verify", json={"email": email, "code": code})
    assert verify.status == 200
    token = verify.cookies[NAME].value
    client.session.cookie_jar.clear()
    return token


@pytest.mark.parametrize(
    ("header", "value"),
    [
        ("studio_session=abc", "abc"),
        ("a=1; studio_session=abc; b=2", "abc"),
        ("a=1;studio_session=abc;b=2", "abc"),
        ("a=1; \t studio_session= abc ;b=2", "abc"),
        ('studio_session="abc"', "abc"),
        ("studio_session=", ""),
        ("studio_session=one; studio_session=two", "one"),
        ("xstudio_session=bad; studio_session=good", "good"),
        ("a=studio_session=bad; studio_session=good", "good"),
        ("mystudio_session=bad", None),
        ("studio_sessions=bad", None),
        ("Studio_Session=bad", None),
        ("", None),
        ("a=1; b=2", None),
    ],
)
def test_the_first_pair_with_exactly_our_name_is_the_cookie(
    header: str, value: str | None
) -> None:
    """Pairs split on ";", blanks ignored, names matched exactly, first one wins."""
    assert find_cookie(header, NAME) == value


def test_an_overlong_value_is_present_but_empty() -> None:
    """Garbage under our name is reported, so the session layer can clear it."""
    assert find_cookie(f"{NAME}={'x' * MAX_VALUE_CHARS}", NAME) == "x" * 256
    assert find_cookie(f"{NAME}={'x' * (MAX_VALUE_CHARS + 1)}", NAME) == ""


def test_several_cookie_headers_are_read_in_order_and_sized_together() -> None:
    """An HTTP/2 hop may split the header; the parts count as one."""
    headers = _headers("a=1", "studio_session=first", "studio_session=second")
    assert read_cookie(headers, NAME) == "first"
    assert cookie_header_size(headers) == len("a=1; studio_session=first; ") + len(
        "studio_session=second"
    )
    assert read_cookie(_headers(), NAME) is None
    assert cookie_header_size(_headers()) == 0
    assert cookie_header_size(_headers("é=1")) == len("é=1".encode())


@pytest.mark.parametrize(
    "crafted",
    [
        "a;" * 4096,
        "a b;" * 2048,
        "a=;" * 2730,
        "studio_session" * 585,
        "xstudio_session=" * 512,
        ";" + " " * 8190,
        'a="' + '\\"' * 4090,
    ],
)
def test_a_crafted_8_kb_header_is_read_in_well_under_a_millisecond(
    crafted: str,
) -> None:
    """No object per pair, no regular expression: linear in the header's length."""
    header = crafted[:8190] + f"; {NAME}=found"
    start = time.process_time()  # CPU time: the parallel suite's load stays out
    for _ in range(100):
        found = find_cookie(header, NAME)
    per_call = (time.process_time() - start) / 100
    assert found in ("found", None)
    assert per_call < 0.001, f"{per_call * 1000:.2f} ms per header"


def test_no_code_reads_the_whole_cookie_header_through_request_cookies() -> None:
    """aiohttp's parser makes a Morsel per pair: 10+ ms for a crafted 8 KB header."""
    sources = sorted(PACKAGE.rglob("*.py"))
    assert any(path.name == "sessions.py" for path in sources)
    offenders = [
        f"{path.relative_to(PACKAGE)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "request.cookies" in line or ".cookies.get(" in line
    ]
    assert offenders == []


async def test_a_cookie_header_over_4_kb_on_api_answers_400_before_anything(
    client: Client,
) -> None:
    """On a session route, an anonymous one and a write: 400 BAD_REQUEST, as JSON."""
    big = "a=" + "x" * (MAX_COOKIE_HEADER_BYTES - 1)
    assert len(big) == MAX_COOKIE_HEADER_BYTES + 1
    for method, path in (
        ("GET", "/api/me"),
        ("GET", "/api/models"),
        ("POST", "/api/auth/logout"),
    ):
        response = await client.request(method, path, headers={"Cookie": big})
        assert response.status == 400, (method, path)
        assert await response.json() == {"error": "BAD_REQUEST"}
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        assert "Set-Cookie" not in response.headers


async def test_a_cookie_header_of_exactly_4_kb_is_read(client: Client) -> None:
    """The bound is inclusive: 4096 bytes pass to the session layer."""
    header = "a=" + "x" * (MAX_COOKIE_HEADER_BYTES - 2)
    response = await client.get("/api/me", headers={"Cookie": header})
    assert response.status == 401
    assert await response.json() == {"error": "NO_SESSION"}


async def test_public_documents_do_not_look_at_the_cookie(client: Client) -> None:
    """The bound is an /api layer: a page answers whatever the browser carries."""
    response = await client.get("/en", headers={"Cookie": "a=" + "x" * 6000})
    assert response.status == 200


async def test_the_session_is_found_among_junk_without_parsing_the_header(
    client: Client, mail_server: MailCatcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Signed in with our cookie between malformed pairs; request.cookies untouched."""
    token = await _sign_in(client, mail_server)

    def parsed(request: web.BaseRequest) -> None:
        raise AssertionError("the whole Cookie header was parsed")

    monkeypatch.setattr(web.BaseRequest, "cookies", property(parsed))
    header = f'a;b c; "q=1; x=\\"; {NAME}={token}; {NAME}=other'
    me = await client.get("/api/me", headers={"Cookie": header})
    assert me.status == 200
    logout = await client.post("/api/auth/logout", headers={"Cookie": header})
    assert logout.status == 204
    after = await client.get("/api/me", headers={"Cookie": header})
    assert after.status == 401
    assert f'{NAME}=""' in after.headers["Set-Cookie"]


async def test_an_overlong_session_cookie_is_cleared(client: Client) -> None:
    """Present but unusable: 401, and the browser is told to drop it."""
    header = f"{NAME}={'x' * (MAX_VALUE_CHARS + 10)}"
    response = await client.get("/api/me", headers={"Cookie": header})
    assert response.status == 401
    assert f'{NAME}=""' in response.headers["Set-Cookie"]
