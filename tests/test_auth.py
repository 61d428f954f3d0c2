"""Sign-in end to end: real Redis, real SMTP server, real cookies."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections import Counter

import pytest
from redis.asyncio import Redis

from service.auth.codes import CodeStore, Verdict, code_key
from service.store.embedded import MailCatcher, RedisServer

from .chaos import late_replies
from .conftest import Client, forget_limits, latest_code


def _address() -> str:
    return f"person-{uuid.uuid4().hex[:10]}@example.com"


async def _request_code(client: Client, email: str, **extra: str) -> dict[str, object]:
    response = await client.post("/api/auth/code", json={"email": email, **extra})
    assert response.status == 200, await response.text()
    body = await response.json()
    assert isinstance(body, dict)
    return body


async def test_the_whole_flow_request_read_verify_use_logout(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """Ask for a code, read it in the mail, sign in, use the session, end it."""
    email = _address()
    assert await _request_code(client, email) == {
        "ok": True,
        "expires_in": 600,
        "resend_after": 60,
    }
    code = latest_code(mail_server, email)
    verify = await client.post(
        "/api/auth/verify", json={"email": email, "code": f"{code[:4]}-{code[4:]} "}
    )
    assert verify.status == 200
    body = await verify.json()
    assert body["new_account"] is True
    assert body["user"]["email"] == email
    assert body["user"]["credits"] == 100
    assert set(body["user"]) == {
        "id",
        "email",
        "credits",
        "credits_owed",  # CONTRACT §8: what a provider refund took beyond the balance
        "created_at",
    }
    cookie = verify.cookies["studio_session"]
    assert cookie["httponly"]
    assert cookie["samesite"] == "Lax"
    assert cookie["path"] == "/"
    assert not cookie["domain"]
    assert not cookie["secure"]  # the test base URL is http
    assert int(cookie["max-age"]) == 30 * 24 * 3600
    assert verify.headers["Cache-Control"] == "no-store"

    me = await client.get("/api/me")
    assert me.status == 200
    assert await me.json() == body["user"]
    stored = [key async for key in redis.scan_iter("studio:session:*")]
    assert len(stored) == 1
    assert cookie.value not in stored[0].decode()

    logout = await client.post("/api/auth/logout")
    assert logout.status == 204
    assert (
        'studio_session=""' in logout.headers["Set-Cookie"]
        or "Max-Age=0" in logout.headers["Set-Cookie"]
    )
    assert [key async for key in redis.scan_iter("studio:session:*")] == []
    assert (await client.get("/api/me")).status == 401


async def test_a_second_sign_in_keeps_the_account_and_its_credits(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """Only the first verify of an address opens an account."""
    email = _address()
    ids = []
    for expected_new in (True, False):
        await forget_limits(redis)
        await _request_code(client, email)
        code = latest_code(mail_server, email)
        verify = await client.post(
            "/api/auth/verify", json={"email": email, "code": code}
        )
        body = await verify.json()
        assert body["new_account"] is expected_new
        assert body["user"]["credits"] == 100
        ids.append(body["user"]["id"])
    assert ids[0] == ids[1]


async def test_a_login_replaces_the_session_the_request_carried(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """Verify deletes the old session before issuing a new one (no fixation)."""
    email = _address()
    tokens = []
    for _ in range(2):
        await forget_limits(redis)
        await _request_code(client, email)
        verify = await client.post(
            "/api/auth/verify",
            json={"email": email, "code": latest_code(mail_server, email)},
        )
        tokens.append(verify.cookies["studio_session"].value)
    assert tokens[0] != tokens[1]
    assert len([key async for key in redis.scan_iter("studio:session:*")]) == 1


async def test_a_code_is_stored_only_as_an_hmac(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """Redis holds the code's HMAC, never the digits, and no key names the address."""
    email = _address()
    await _request_code(client, email)
    code = latest_code(mail_server, email)
    keys = [key async for key in redis.scan_iter("studio:*")]
    assert keys
    for key in keys:
        assert email.encode() not in key
        assert code.encode() not in key
        if await redis.type(key) == b"hash":
            values = list((await redis.hgetall(key)).values())
        else:
            values = [await redis.get(key) or b""]
        for value in values:
            assert code.encode() not in value


async def test_the_code_mail_is_well_formed_in_both_languages(
    client: Client, mail_server: MailCatcher
) -> None:
    """Plain text and HTML, readable code, Message-ID and Date; Chinese by default."""
    for lang, subject in ((None, "登录验证码"), ("en", "sign-in code")):
        email = _address()
        await _request_code(client, email, **({"lang": lang} if lang else {}))
        message = next(m for m in reversed(mail_server.messages) if m["To"] == email)
        assert subject in message["Subject"]
        assert message["Message-ID"]
        assert message["Date"]
        assert message.get_content_type() == "multipart/alternative"
        html = message.get_body(preferencelist=("html",))
        assert html is not None
        code = latest_code(mail_server, email)
        assert f"{code[:4]} {code[4:]}" in html.get_content()
        assert code not in message["Subject"]


async def test_the_code_request_answers_the_same_for_new_and_known_addresses(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """No enumeration: status and body are identical."""
    known = _address()
    await _request_code(client, known)
    await client.post(
        "/api/auth/verify",
        json={"email": known, "code": latest_code(mail_server, known)},
    )
    await forget_limits(redis)
    first = await client.post("/api/auth/code", json={"email": known})
    second = await client.post("/api/auth/code", json={"email": _address()})
    assert first.status == second.status == 200
    assert await first.read() == await second.read()


@pytest.mark.parametrize(
    "email",
    [
        "not-an-address",
        "a@b",
        "victim@example.com\r\nBcc: attacker@evil.test",
        "victim@example.com\nSubject: hi",
        '"quoted"@example.com',
        "user@[127.0.0.1]",
        "Someone <someone@example.com>",
        "x" * 250 + "@example.com",
        "",
        12,
        None,
    ],
)
async def test_invalid_addresses_and_header_injection_get_400_and_no_mail(
    client: Client, mail_server: MailCatcher, email: object
) -> None:
    """Nothing reaches the SMTP server for a bad address."""
    before = len(mail_server.messages)
    response = await client.post("/api/auth/code", json={"email": email})
    assert response.status == 400
    assert await response.json() == {"error": "INVALID_EMAIL"}
    assert len(mail_server.messages) == before


@pytest.mark.parametrize(
    ("body", "content_type", "status", "error"),
    [
        (
            b'{"email": "a@example.com", "extra": 1}',
            "application/json",
            400,
            "BAD_REQUEST",
        ),
        (
            b'{"email": "a@example.com", "lang": "fr"}',
            "application/json",
            400,
            "BAD_REQUEST",
        ),
        (b"{not json", "application/json", 400, "BAD_REQUEST"),
        (b"[" * 3000, "application/json", 400, "BAD_REQUEST"),  # nesting too deep
        (b'["a@example.com"]', "application/json", 400, "BAD_REQUEST"),
        # Python reads these constants; RFC 8259 has no such values
        (b'{"email": NaN}', "application/json", 400, "BAD_REQUEST"),
        (
            b'{"email": "a@example.com", "lang": -Infinity}',
            "application/json",
            400,
            "BAD_REQUEST",
        ),
        (
            b"email=a@example.com",
            "application/x-www-form-urlencoded",
            415,
            "UNSUPPORTED_MEDIA_TYPE",
        ),
        (b'{"email": "a@example.com"}', "text/plain", 415, "UNSUPPORTED_MEDIA_TYPE"),
        (
            b'{"email": "' + b"a" * 20000 + b'"}',
            "application/json",
            413,
            "PAYLOAD_TOO_LARGE",
        ),
    ],
)
async def test_malformed_requests_get_a_clear_error(
    client: Client, body: bytes, content_type: str, status: int, error: str
) -> None:
    """Wrong type, wrong fields, bad JSON or too big: the right status and code."""
    response = await client.post(
        "/api/auth/code", data=body, headers={"Content-Type": content_type}
    )
    assert response.status == status
    assert await response.json() == {"error": error}


async def test_expired_reused_and_never_requested_codes_get_one_answer(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """INVALID_CODE for every way a code is not valid."""
    never = await client.post(
        "/api/auth/verify", json={"email": _address(), "code": "12345678"}
    )
    email = _address()
    await _request_code(client, email)
    code = latest_code(mail_server, email)
    assert (
        await client.post("/api/auth/verify", json={"email": email, "code": code})
    ).status == 200
    reused = await client.post("/api/auth/verify", json={"email": email, "code": code})
    expiring = _address()
    await _request_code(client, expiring)
    async for key in redis.scan_iter("studio:code:*"):
        await redis.delete(key)  # what the 10-minute TTL does
    expired = await client.post(
        "/api/auth/verify",
        json={"email": expiring, "code": latest_code(mail_server, expiring)},
    )
    for response in (never, reused, expired):
        assert response.status == 400
        assert await response.json() == {"error": "INVALID_CODE"}


async def test_codes_live_ten_minutes(client: Client, redis: Redis) -> None:
    """The code's key expires after 600 s."""
    await _request_code(client, _address())
    keys = [key async for key in redis.scan_iter("studio:code:*")]
    assert len(keys) == 1
    assert 595 <= await redis.ttl(keys[0]) <= 600


async def test_a_new_code_replaces_the_old_one(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """One live code per address."""
    email = _address()
    await _request_code(client, email)
    old = latest_code(mail_server, email)
    await forget_limits(redis)
    await _request_code(client, email)
    new = latest_code(mail_server, email)
    if old != new:
        stale = await client.post(
            "/api/auth/verify", json={"email": email, "code": old}
        )
        assert await stale.json() == {"error": "INVALID_CODE"}
    fresh = await client.post("/api/auth/verify", json={"email": email, "code": new})
    assert fresh.status == 200


async def test_twenty_concurrent_wrong_codes_count_exactly_five_and_burn_it(
    client: Client, mail_server: MailCatcher
) -> None:
    """Attempts are counted atomically before comparing; the fifth burns the code."""
    email = _address()
    await _request_code(client, email)
    code = latest_code(mail_server, email)
    wrong = f"{(int(code) + 1) % 10**8:08d}"
    responses = await asyncio.gather(
        *(
            client.post("/api/auth/verify", json={"email": email, "code": wrong})
            for _ in range(20)
        )
    )
    errors = Counter([(await r.json())["error"] for r in responses])
    assert errors == {"INVALID_CODE": 19, "CODE_EXPIRED_REQUEST_NEW": 1}
    late = await client.post("/api/auth/verify", json={"email": email, "code": code})
    assert await late.json() == {"error": "INVALID_CODE"}


async def test_two_concurrent_right_codes_open_one_session(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """The code is consumed exactly once."""
    email = _address()
    await _request_code(client, email)
    code = latest_code(mail_server, email)
    responses = await asyncio.gather(
        *(
            client.post("/api/auth/verify", json={"email": email, "code": code})
            for _ in range(2)
        )
    )
    assert sorted(r.status for r in responses) == [200, 400]
    assert len([key async for key in redis.scan_iter("studio:session:*")]) == 1


async def test_code_input_ignores_spaces_and_hyphens(
    client: Client, mail_server: MailCatcher
) -> None:
    """1234 5678, 1234-5678 and 12345678 are one code."""
    email = _address()
    await _request_code(client, email)
    code = latest_code(mail_server, email)
    spaced = " ".join(code) + "\t"
    response = await client.post(
        "/api/auth/verify", json={"email": email, "code": spaced}
    )
    assert response.status == 200


async def test_the_address_is_normalised_before_it_is_keyed(
    client: Client, mail_server: MailCatcher
) -> None:
    """Case and surrounding space do not make a second identity."""
    email = _address()
    await _request_code(client, "  " + email.upper() + " ")
    code = latest_code(mail_server, email)
    response = await client.post(
        "/api/auth/verify", json={"email": email, "code": code}
    )
    assert response.status == 200
    assert re.fullmatch(r"[0-9a-f]{24}", (await response.json())["user"]["id"])


async def test_an_internationalised_domain_is_mailed_in_its_ascii_form(
    client: Client, mail_server: MailCatcher
) -> None:
    """The envelope uses IDNA, so a relay without SMTPUTF8 still delivers."""
    unicode_address = f"u{uuid.uuid4().hex[:6]}@bücher.example"
    response = await client.post("/api/auth/code", json={"email": unicode_address})
    assert response.status == 200
    ascii_address = unicode_address.replace("bücher", "xn--bcher-kva")
    code = latest_code(mail_server, ascii_address)
    verify = await client.post(
        "/api/auth/verify", json={"email": unicode_address, "code": code}
    )
    assert verify.status == 200
    assert (await verify.json())["user"]["email"] == unicode_address


async def test_a_code_check_retried_after_its_reply_was_lost_signs_in(
    redis_server: RedisServer, redis: Redis
) -> None:
    """The first try spent the right code; the retry says OK (not NO_CODE), a
    wrong code's retry spends no second attempt, and the spent code stays spent."""
    store = CodeStore(redis, "k" * 32)
    await store.verify("addr0", "bind0", "00000000")  # the script is loaded
    code, _ = await store.issue("addr1", "bind1")
    wrong = f"{(int(code) + 1) % 10**8:08d}"
    async with late_replies(redis_server.port) as (slow, late):
        retried = CodeStore(slow, "k" * 32)
        bad = await late(retried.verify("addr1", "bind1", wrong), marker=b"EVALSHA")
        assert bad is Verdict.BAD
        assert await redis.hget(code_key("addr1", "bind1"), "a") == b"1"
        ok = await late(retried.verify("addr1", "bind1", code), marker=b"EVALSHA")
    assert ok is Verdict.OK
    assert await store.verify("addr1", "bind1", code) is Verdict.NO_CODE
