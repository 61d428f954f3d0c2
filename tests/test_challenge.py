"""Proof of work before sign-in mail: asked under pressure, spent once, same for all."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
import uuid
from collections import Counter
from typing import Any

import aiohttp
import pytest
from altcha import Challenge, Payload, create_challenge, solve_challenge
from pytest_aiohttp import AiohttpClient
from redis.asyncio import Redis

from service.app import create_app
from service.auth.challenge import (
    ALGORITHM,
    COST,
    MAX_CEILING,
    MIN_CEILING,
    ceiling,
    keys_for,
    pressure_of,
)
from service.limits.client_ip import network_of
from service.limits.limiter import BucketState, Decision, Policy
from service.store.embedded import MailCatcher, RedisServer

from .conftest import TEST_SECRET, Client, SettingsFactory, latest_code
from .processes import running

# Wall-clock budgets: `make test` runs this module after the parallel part, alone.
pytestmark = pytest.mark.timing

# One request without work per network, then a challenge.
NOISY_AFTER_ONE = {
    "STUDIO_LIMITS_CODE_NET_FREE_QUOTA": "2",
    "STUDIO_LIMITS_CODE_NET_FREE_BURST": "1",
}


def _address() -> str:
    return f"pow-{uuid.uuid4().hex[:10]}@example.com"


def solve(challenge: dict[str, Any]) -> str:
    """Solve a challenge as a script would, with the altcha library's solver."""
    parsed = Challenge.from_dict(challenge)
    solution = solve_challenge(parsed)
    assert solution is not None
    return Payload(parsed, solution).to_base64()


def encoded(data: object) -> str:
    """Base64 of some JSON, the way a payload travels."""
    return base64.b64encode(json.dumps(data).encode()).decode()


async def ask(client: Client, email: str, altcha: object = None) -> Any:
    """POST /api/auth/code, with a solution if one is given."""
    body: dict[str, Any] = {"email": email}
    if altcha is not None:
        body["altcha"] = altcha
    return await client.post("/api/auth/code", json=body)


async def challenged(response: Any) -> dict[str, Any]:
    """Check the 429 CHALLENGE_REQUIRED answer and return its challenge."""
    assert response.status == 429
    assert response.headers["Retry-After"] == "0"
    assert response.headers["Cache-Control"] == "no-store"
    body = await response.json()
    assert body["error"] == "CHALLENGE_REQUIRED"
    challenge: dict[str, Any] = body["challenge"]
    assert set(challenge) == {"parameters", "signature"}
    parameters = challenge["parameters"]
    assert parameters["algorithm"] == ALGORITHM
    assert parameters["cost"] == COST
    assert parameters["expiresAt"] > time.time()
    return challenge


async def noisy_client(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, **variables: str
) -> Client:
    """An app whose network is noisy after one code request: the next is challenged."""
    settings = make_settings(**NOISY_AFTER_ONE, **variables)
    client = await aiohttp_client(create_app(settings))
    assert (await ask(client, _address())).status == 200
    return client


async def test_a_quiet_network_gets_its_code_without_any_work(
    client: Client, mail_server: MailCatcher, redis: Redis
) -> None:
    """No pressure, no challenge: the first request of a network is simply served."""
    email = _address()
    response = await ask(client, email)
    assert response.status == 200
    assert latest_code(mail_server, email)


async def test_a_noisy_network_is_asked_for_work_before_the_address_is_charged(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """The 429 carries an ALTCHA challenge, and no bucket of the address moved."""
    client = await noisy_client(aiohttp_client, make_settings)
    before = {k async for k in redis.scan_iter("studio:rl:v1:{em:*")}
    await challenged(await ask(client, _address()))
    assert {k async for k in redis.scan_iter("studio:rl:v1:{em:*")} == before


async def test_a_solved_challenge_passes_once_and_its_replay_is_challenged_again(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """The solution buys one mail; sent again it gets a new challenge."""
    client = await noisy_client(aiohttp_client, make_settings)
    email = _address()
    challenge = await challenged(await ask(client, email))
    payload = solve(challenge)
    assert (await ask(client, email, payload)).status == 200
    assert latest_code(mail_server, email)
    replayed = await challenged(await ask(client, _address(), payload))
    assert replayed["signature"] != challenge["signature"]


async def test_a_wrong_expired_or_foreign_solution_gets_a_new_challenge(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """Whatever is wrong with it, the answer is the same 429 with a fresh challenge."""
    settings = make_settings(**NOISY_AFTER_ONE)
    client = await aiohttp_client(create_app(settings))
    assert (await ask(client, _address())).status == 200
    challenge = await challenged(await ask(client, _address()))
    good = json.loads(base64.b64decode(solve(challenge)))
    wrong_key = {**good, "solution": {**good["solution"], "derivedKey": "00" * 32}}
    cheaper = json.loads(json.dumps(good))
    cheaper["challenge"]["parameters"]["cost"] = 1
    keys = keys_for(settings.secret_key)
    expired = create_challenge(
        ALGORITHM,
        COST,
        counter=3,
        expires_at=int(time.time()) - 1,
        hmac_secret=keys.challenge,
        hmac_key_secret=keys.derived,
    )
    foreign = create_challenge(
        ALGORITHM,
        COST,
        counter=3,
        expires_at=int(time.time()) + 60,
        hmac_secret=b"someone else's key",
        hmac_key_secret=b"someone else's other key",
    )
    attempts = [
        encoded(wrong_key),
        encoded(cheaper),
        solve(expired.to_dict()),
        solve(foreign.to_dict()),
        "",
        "not base64 at all!",
        encoded([]),
        encoded({"challenge": 1, "solution": []}),
        encoded({"challenge": {"parameters": []}, "solution": {}}),
    ]
    seen = {challenge["signature"]}
    for attempt in attempts:
        fresh = await challenged(await ask(client, _address(), attempt))
        assert fresh["signature"] not in seen
        seen.add(fresh["signature"])
    assert not [k async for k in redis.scan_iter("studio:altcha:*")]
    # the good one still works: failures spent nothing
    assert (await ask(client, _address(), encoded(good))).status == 200


async def test_the_solver_auth_md_shows_programs_gets_a_code(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """The standard-library example in /auth.md solves a real challenge."""
    client = await noisy_client(aiohttp_client, make_settings)
    text = await (await client.get("/auth.md")).text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    assert len(blocks) == 1
    namespace: dict[str, Any] = {}
    exec(blocks[0], namespace)  # the documented code, as a program would run it
    email = _address()
    challenge = await challenged(await ask(client, email))
    altcha = await asyncio.to_thread(namespace["solve"], challenge)
    assert (await ask(client, email, altcha)).status == 200
    assert latest_code(mail_server, email)


@pytest.mark.parametrize("altcha", [123, ["x"], {"a": 1}, True])
async def test_a_solution_that_is_not_a_string_is_a_bad_request(
    client: Client, redis: Redis, altcha: object
) -> None:
    """The field is base64 text; anything else is 400 like any wrong field."""
    response = await ask(client, _address(), altcha)
    assert response.status == 400
    assert (await response.json()) == {"error": "BAD_REQUEST"}


async def test_known_and_unknown_addresses_get_the_same_challenge(
    aiohttp_client: AiohttpClient,
    make_settings: SettingsFactory,
    mail_server: MailCatcher,
    redis: Redis,
) -> None:
    """Under pressure an account's address and a stranger's read alike."""
    client = await aiohttp_client(create_app(make_settings(**NOISY_AFTER_ONE)))
    known = _address()
    assert (await ask(client, known)).status == 200
    verified = await client.post(
        "/api/auth/verify",
        json={"email": known, "code": latest_code(mail_server, known)},
    )
    assert verified.status == 200
    answers = []
    for email in (known, _address()):
        response = await ask(client, email)
        challenge = await challenged(response)
        answers.append(
            (
                response.status,
                sorted(response.headers),
                sorted(challenge["parameters"]),
                {
                    k: v
                    for k, v in challenge["parameters"].items()
                    if k not in ("nonce", "salt", "keyPrefix", "keySignature")
                },
            )
        )
    assert answers[0] == answers[1]


async def test_solvers_spend_a_reserve_that_requests_without_work_cannot(
    aiohttp_client: AiohttpClient, make_settings: SettingsFactory, redis: Redis
) -> None:
    """mail-free 1 of mail-global 3: one free mail, then two for solvers, then none."""
    settings = make_settings(
        STUDIO_LIMITS_MAIL_FREE_QUOTA="2",
        STUDIO_LIMITS_MAIL_FREE_BURST="1",
        STUDIO_LIMITS_MAIL_GLOBAL_QUOTA="4",
        STUDIO_LIMITS_MAIL_GLOBAL_BURST="3",
    )
    client = await aiohttp_client(create_app(settings))
    assert (await ask(client, _address())).status == 200
    statuses = []
    for _ in range(3):
        email = _address()
        challenge = await challenged(await ask(client, email))
        response = await ask(client, email, solve(challenge))
        statuses.append(response.status)
    assert statuses == [200, 200, 429]
    assert (await response.json())["violated-policies"] == ["mail-global"]


def test_the_work_rises_with_the_pressure_on_the_outer_buckets() -> None:
    """From 1,000 tries at most when calm to 20,000 when a budget is spent."""
    assert ceiling(0) == MIN_CEILING
    assert ceiling(1) == MAX_CEILING
    assert ceiling(-1) == MIN_CEILING
    assert ceiling(2) == MAX_CEILING
    steps = [ceiling(p / 10) for p in range(11)]
    assert steps == sorted(steps)
    assert len(set(steps)) == 11
    outer = Policy("mail-global", 1000, 3600, 500)
    free = Policy("mail-free", 500, 3600, 250)

    def state(policy: Policy, remaining: int) -> BucketState:
        return BucketState(policy, remaining, 0, 0)

    decision = Decision(True, (state(free, 0), state(outer, 250)))
    assert pressure_of([decision]) == 0.5  # the empty free bucket does not count


def test_networks_are_the_ipv4_24_and_the_ipv6_48() -> None:
    """Neighbours share a network subject; the next network does not."""
    assert network_of("ip4:203.0.113.7") == network_of("ip4:203.0.113.250")
    assert network_of("ip4:203.0.113.7") == "net4:203.0.113.0/24"
    assert network_of("ip4:203.0.114.7") != network_of("ip4:203.0.113.7")
    assert network_of("ip6:2001:db8:1:2::/64") == "net6:2001:db8:1::/48"
    assert network_of("ip6:2001:db8:1:ff::/64") == "net6:2001:db8:1::/48"
    assert network_of("unknown") == "net:unknown"


# --- against the real server, from many loopback source addresses -------------


async def _post(
    session: aiohttp.ClientSession, base: str, body: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    async with session.post(f"{base}/api/auth/code", json=body) as response:
        return response.status, await response.json(content_type=None)


async def _warm_up(base: str) -> None:
    """Open the server's Redis connections with a burst of square reads first.

    A cold server opens its limiter pool during the flood's first burst; on a
    busy machine that alone can outlast the limiter's 100 ms and answer 503.
    """
    connector = aiohttp.TCPConnector(local_addr=("127.251.0.1", 0))
    async with aiohttp.ClientSession(connector=connector) as session:

        async def read() -> None:
            async with session.get(f"{base}/api/square") as response:
                await response.read()

        await asyncio.gather(*(read() for _ in range(20)))


async def _flood(base: str, sources: list[str]) -> list[str]:
    """Each source asks 11 times in a row for a throw-away address, all at once."""
    await _warm_up(base)

    async def one(source: str) -> list[str]:
        connector = aiohttp.TCPConnector(local_addr=(source, 0))
        async with aiohttp.ClientSession(connector=connector) as session:
            answers = []
            for j in range(11):
                body = {"email": f"flood-{source}-{j}@example.net"}
                status, answer = await _post(session, base, body)
                answers.append(f"{status} {answer.get('error', 'ok')}")
            return answers

    rounds = await asyncio.gather(*(one(source) for source in sources))
    return [answer for answers in rounds for answer in answers]


async def _bystander(base: str, source: str, email: str) -> list[str]:
    """Ask once; solve the challenge if one comes back, and ask again with it."""
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as session:
        body = {"email": email}
        status, answer = await _post(session, base, body)
        steps = [f"{status} {answer.get('error', 'ok')}"]
        if answer.get("error") == "CHALLENGE_REQUIRED":
            body["altcha"] = await asyncio.to_thread(solve, answer["challenge"])
            status, answer = await _post(session, base, body)
            steps.append(f"{status} {answer.get('error', 'ok')}")
        return steps


def _serve_variables(redis_server: RedisServer, mail: MailCatcher) -> dict[str, str]:
    """The defaults of `serve`, on the test's Redis and SMTP catcher."""
    return {
        "STUDIO_REDIS_URL": redis_server.url,
        "STUDIO_SECRET_KEY": TEST_SECRET,
        "STUDIO_SMTP_HOST": mail.host,
        "STUDIO_SMTP_PORT": str(mail.port),
    }


def _mail_since(mail: MailCatcher, count: int, timeout: float = 5.0) -> int:
    """Messages received after the first `count`, once they stop arriving."""
    deadline = time.monotonic() + timeout
    seen = -1
    while time.monotonic() < deadline:
        now = len(mail.messages)
        if now == seen:
            break
        seen = now
        time.sleep(0.3)
    return len(mail.messages) - count


async def test_sixty_networks_draining_the_mail_budget_leave_a_bystander_a_code(
    redis_server: RedisServer, mail_server: MailCatcher, redis: Redis
) -> None:
    """660 requests from 60 /24s spend only mail-free; a solver still gets mail."""
    sources = [f"127.{i}.0.1" for i in range(1, 61)]
    before = len(mail_server.messages)
    with running("serve", _serve_variables(redis_server, mail_server)) as (base, _):
        answers = await _flood(base, sources)
        bystander = await _bystander(base, "127.250.0.1", "bystander@example.org")
    assert answers.count("429 RATE_LIMITED") == 60, Counter(answers)  # code-ip: 10 each
    assert 250 <= answers.count("200 ok") <= 252  # mail-free's burst (+ refills)
    assert answers.count("429 CHALLENGE_REQUIRED") == 600 - answers.count("200 ok")
    assert bystander == ["429 CHALLENGE_REQUIRED", "200 ok"]
    assert latest_code(mail_server, "bystander@example.org")
    assert _mail_since(mail_server, before) == answers.count("200 ok") + 1


async def test_sixty_addresses_of_one_network_are_challenged_and_others_are_not(
    redis_server: RedisServer, mail_server: MailCatcher, redis: Redis
) -> None:
    """A noisy /24 gets 20 mails without work; a neighbour solves, a stranger not."""
    sources = [f"127.0.0.{i}" for i in range(2, 62)]
    with running("serve", _serve_variables(redis_server, mail_server)) as (base, _):
        answers = await _flood(base, sources)
        neighbour = await _bystander(base, "127.0.0.99", "neighbour@example.org")
        stranger = await _bystander(base, "127.9.9.9", "stranger@example.org")
    assert answers.count("200 ok") == 20, Counter(answers)  # code-net-free's burst
    assert answers.count("429 RATE_LIMITED") == 60
    assert answers.count("429 CHALLENGE_REQUIRED") == 580
    assert neighbour == ["429 CHALLENGE_REQUIRED", "200 ok"]
    assert stranger == ["200 ok"]
