"""Measure issue #15's mail-budget attack against the real `serve` with its defaults.

60 loopback source addresses at once each ask 11 times in a row for a code to a
throw-away address (660 requests), then a bystander on a fresh address asks for
one, solving the proof of work if the server asks for it. Prints one JSON line:
the answers the attack got, how much mail went out, and what the bystander got.
Usage: python -m bench.mail_budget [--same-network]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import time
from collections import Counter
from typing import Any

import aiohttp
from altcha import Challenge, Payload, solve_challenge

from service.store.embedded import MailCatcher, RedisServer
from tests.processes import running

SECRET = "bench-secret-key-0123456789abcdef-0123456789"


def solve(challenge: dict[str, Any]) -> str:
    """Answer an ALTCHA challenge the way a script would: the altcha solver."""
    parsed = Challenge.from_dict(challenge)
    solution = solve_challenge(parsed)
    assert solution is not None
    payload = json.dumps(Payload(parsed, solution).to_dict())
    return base64.b64encode(payload.encode()).decode()


async def ask(
    session: aiohttp.ClientSession, base: str, body: dict[str, str]
) -> tuple[int, dict[str, Any]]:
    """POST /api/auth/code; return the status and the JSON answer."""
    async with session.post(f"{base}/api/auth/code", json=body) as response:
        return response.status, await response.json(content_type=None)


async def flood(
    session: aiohttp.ClientSession, base: str, index: int
) -> list[tuple[int, dict[str, Any]]]:
    """One source's 11 requests, one after another, each to a fresh address."""
    return [
        await ask(session, base, {"email": f"victim{index}-{j}@example.net"})
        for j in range(11)
    ]


def sources(same_network: bool) -> list[str]:
    """60 loopback addresses: one /24 each, or all in 127.0.0.0/24."""
    if same_network:
        return [f"127.0.0.{i}" for i in range(2, 62)]
    return [f"127.{i}.0.1" for i in range(1, 61)]


async def attack(base: str, same_network: bool) -> dict[str, Any]:
    """Run the flood, then the bystander; return what each got."""
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(s, 0)))
        for s in sources(same_network)
    ]
    try:
        started = time.monotonic()
        rounds = await asyncio.gather(
            *(flood(session, base, i) for i, session in enumerate(sessions))
        )
        answers = [answer for answers in rounds for answer in answers]
        elapsed = time.monotonic() - started
    finally:
        for session in sessions:
            await session.close()
    outcomes = Counter(
        f"{status} {body.get('error', 'ok')}" for status, body in answers
    )
    connector = aiohttp.TCPConnector(local_addr=("127.250.0.1", 0))
    async with aiohttp.ClientSession(connector=connector) as bystander:
        body = {"email": "bystander@example.org"}
        status, answer = await ask(bystander, base, body)
        steps = [f"{status} {answer.get('error', 'ok')}"]
        solved_in = 0.0
        if answer.get("error") == "CHALLENGE_REQUIRED":
            began = time.monotonic()
            body["altcha"] = solve(answer["challenge"])
            solved_in = time.monotonic() - began
            status, answer = await ask(bystander, base, body)
            steps.append(f"{status} {answer.get('error', 'ok')}")
    return {
        "attack_requests": len(answers),
        "attack_seconds": round(elapsed, 2),
        "attack_answers": dict(outcomes),
        "bystander": steps,
        "bystander_solve_seconds": round(solved_in, 2),
    }


def main() -> None:
    """Start Redis, the SMTP catcher and `serve`; attack; print the numbers."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--same-network", action="store_true")
    same_network = parser.parse_args().same_network
    with RedisServer() as redis, MailCatcher() as mail:
        variables = {
            "STUDIO_REDIS_URL": redis.url,
            "STUDIO_SECRET_KEY": SECRET,
            "STUDIO_SMTP_HOST": mail.host,
            "STUDIO_SMTP_PORT": str(mail.port),
        }
        with running("serve", variables) as (base, _):
            result = asyncio.run(attack(base, same_network))
        time.sleep(0.5)
        result["mail_sent"] = len(mail.messages)
        result["bystander_got_mail"] = any(
            m["To"] == "bystander@example.org" for m in mail.messages
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
