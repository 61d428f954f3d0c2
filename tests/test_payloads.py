"""JSON bodies: strict UTF-8, and no lone surrogate in any string that we keep."""

from __future__ import annotations

import json
import logging
import timeit
from collections.abc import Callable
from pathlib import Path

import pytest
from redis.asyncio import Redis

from service.api.payloads import may_hold_surrogates
from service.store.embedded import MailCatcher

from .conftest import Client, MakeClient
from .logs import troubles
from .test_library import make_works
from .workbench import sign_in

JSON = {"Content-Type": "application/json"}
LONE = ("\\ud800", "\\uDBFF", "\\udc00", "\\uDFFF", "\\ud83d x", "x \\ude00")


async def _post(client: Client, path: str, raw: bytes) -> tuple[int, object]:
    response = await client.post(path, data=raw, headers=JSON)
    return response.status, await response.json()


@pytest.mark.parametrize("escape", LONE)
async def test_a_lone_surrogate_in_a_submitted_prompt_is_a_400_naming_it(
    studio: MakeClient,
    mail_server: MailCatcher,
    caplog: pytest.LogCaptureFixture,
    escape: str,
) -> None:
    """JSON can escape half a pair, which no store can encode: refused, not a 500."""
    client = await studio()
    await sign_in(client, mail_server)
    caplog.set_level(logging.INFO)
    for field in ("prompt", "negative_prompt"):
        body = {"model": "seedream-4", "prompt": "a cat", field: f"a {escape} b"}
        raw = json.dumps(body).replace("\\\\", "\\").encode()
        assert await _post(client, "/api/generations", raw) == (
            400, {"error": "BAD_REQUEST", "field": field},
        )  # fmt: skip
    listed = await (await client.get("/api/generations")).json()
    assert listed["items"] == []
    assert troubles(caplog) == []


async def test_surrogates_encoded_as_bytes_are_not_utf8_and_are_refused(
    studio: MakeClient, mail_server: MailCatcher, caplog: pytest.LogCaptureFixture
) -> None:
    """Python's json would read "surrogatepass" bytes (ED A0 80); UTF-8 does not."""
    client = await studio()
    await sign_in(client, mail_server)
    caplog.set_level(logging.INFO)
    raw = '{"model":"seedream-4","prompt":"a\ud800"}'.encode("utf-8", "surrogatepass")
    assert await _post(client, "/api/generations", raw) == (
        400, {"error": "BAD_REQUEST"},
    )  # fmt: skip
    assert troubles(caplog) == []


async def test_lone_surrogates_anywhere_in_any_body_are_a_400(
    studio: MakeClient,
    mail_server: MailCatcher,
    redis: Redis,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Keys, nested values, report reasons, e-mail addresses, order fields."""
    client = await studio(STUDIO_MEDIA_DIR=str(tmp_path / "media"))
    me = await sign_in(client, mail_server)
    (work,) = await make_works(redis, tmp_path, me["id"], 1)
    caplog.set_level(logging.INFO)
    cases = [
        ("/api/works/{wid}/report", '{"reason":"spam \\udead"}', "reason"),
        ("/api/auth/code", '{"email":"a\\ud800@example.com"}', "email"),
        ("/api/auth/verify", '{"email":"a@example.com","code":"\\udfff"}', "code"),
        ("/api/orders", '{"pack":"p98","channel":"alipay\\ud800"}', "channel"),
        ("/api/generations", '{"model":"seedream-4","prompt":"a","\\ud800":1}', None),
        ("/api/generations", '{"model":"seedream-4","prompt":["\\ud800"]}', "prompt"),
        ("/api/generations", '{"model":"seedream-4","prompt":{"\\ud800":1}}', "prompt"),
    ]
    for path, text, field in cases:
        expected = {"error": "BAD_REQUEST"} | ({"field": field} if field else {})
        status, body = await _post(client, path.format(wid=work["id"]), text.encode())
        assert (status, body) == (400, expected), (path, text)
    assert troubles(caplog) == []


async def test_whole_pairs_and_plain_text_still_pass(
    studio: MakeClient, mail_server: MailCatcher
) -> None:
    """An escaped pair is one character (an emoji): taken and stored as sent."""
    client = await studio()
    await sign_in(client, mail_server)
    raw = b'{"model":"seedream-4","prompt":"a cat \\ud83d\\ude3a and \\\\ud800"}'
    response = await client.post("/api/generations", data=raw, headers=JSON)
    assert response.status == 202, await response.text()
    assert (await response.json())["prompt"] == "a cat \U0001f63a and \\ud800"


def _best(run: Callable[[], object]) -> float:
    return min(timeit.repeat(run, number=200, repeat=7))


@pytest.mark.timing  # a wall-clock ratio: run alone, after the parallel part
def test_the_surrogate_check_is_nearly_free_on_what_browsers_send() -> None:
    """Submit is a hot path: a 13 KiB UTF-8 body costs a tenth of json.loads."""
    text = json.dumps({"prompt": "一只猫坐在窗台上 " * 540}, ensure_ascii=False)
    raw = text.encode()
    assert not may_hold_surrogates(raw)
    assert (
        _best(lambda: may_hold_surrogates(raw)) < _best(lambda: json.loads(text)) / 10
    )


@pytest.mark.timing  # a wall-clock budget: run alone, after the parallel part
def test_the_surrogate_check_of_an_all_escaped_body_stays_near_json_loads() -> None:
    """Python clients escape every CJK letter: the scan stays within 3x json.loads."""
    text = json.dumps({"prompt": "一只猫坐在窗台上 " * 270, "emoji": "\U0001f63a"})
    raw = text.encode()
    assert may_hold_surrogates(raw)  # the emoji's escaped pair: walked, and taken
    assert _best(lambda: may_hold_surrogates(raw)) < 3 * _best(lambda: json.loads(text))
