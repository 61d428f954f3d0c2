"""Issue 15's targeted lockout, measured again against `serve` with default limits.

An attacker asks for a code for the victim's address from a new loopback
source address at each refill of the one-a-minute cooldown, and burns it with
five wrong guesses; after three rounds (two minutes) the victim asks for a
code. Run beside it: a victim who had asked for a code before the attack
signs in with it after the attack. Takes about two minutes:

    .venv/bin/python bench/lockout.py
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import aiohttp
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from service.store.embedded import MailCatcher, RedisServer
from tests.conftest import TEST_SECRET, latest_code
from tests.processes import running

GUESSES = ("00000000", "11111111", "22222222", "33333333", "44444444")


def _browser(base_url: str, source: str) -> aiohttp.ClientSession:
    """A browser of its own: own cookie jar, own loopback source address."""
    return aiohttp.ClientSession(
        base_url,
        cookie_jar=aiohttp.CookieJar(unsafe=True),
        connector=aiohttp.TCPConnector(local_addr=(source, 0)),
    )


async def _ask(browser: aiohttp.ClientSession, email: str) -> tuple[int, str]:
    """Ask for a code; return the status and Retry-After ("" without one)."""
    async with browser.post("/api/auth/code", json={"email": email}) as response:
        await response.read()
        return response.status, response.headers.get("Retry-After", "")


async def _try(browser: aiohttp.ClientSession, email: str, code: str) -> str:
    """Submit a code; return "OK" or the error code."""
    async with browser.post(
        "/api/auth/verify", json={"email": email, "code": code}
    ) as response:
        body: dict[str, Any] = await response.json()
        return str(body.get("error", "OK"))


async def _attack(
    base_url: str, email: str, rounds: int, spacing: float, first_source: int
) -> list[str]:
    """Request and burn the victim's code once per refill, from a new address each."""
    seen = []
    for n in range(rounds):
        if n:
            await asyncio.sleep(spacing)
        async with _browser(base_url, f"127.0.0.{first_source + n}") as attacker:
            status, _ = await _ask(attacker, email)
            burned = [await _try(attacker, email, guess) for guess in GUESSES]
            async with _browser(base_url, f"127.0.0.{first_source + n}") as bare:
                blind = [await _try(bare, email, guess) for guess in GUESSES]
        seen.append(f"round {n + 1}: /code {status}, 5th guess {burned[-1]}, ")
        seen[-1] += f"cookieless 5th guess {blind[-1]}"
    return seen


async def measure(
    base_url: str, redis_url: str, mail: MailCatcher, rounds: int, spacing: float
) -> None:
    """Run both victims against the same attack; print what each one got."""
    returning, waiting = (f"victim-{uuid.uuid4().hex[:8]}@example.com" for _ in "ab")
    async with (
        _browser(base_url, "127.0.0.2") as device,
        _browser(base_url, "127.0.0.3") as fresh,
        _browser(base_url, "127.0.0.4") as midway,
    ):
        # The returning victim signed in with this browser some time ago.
        assert (await _ask(device, returning))[0] == 200
        assert await _try(device, returning, latest_code(mail, returning)) == "OK"
        await device.post("/api/auth/logout")
        # ...long enough ago that the address's buckets are full again.
        async with Redis.from_url(redis_url) as redis:
            async for key in redis.scan_iter("studio:rl:v1:{em:*"):
                await redis.delete(key)
        # The other victim asks for a code just before the attack starts.
        assert (await _ask(midway, waiting))[0] == 200
        own_code = latest_code(mail, waiting)
        await asyncio.sleep(spacing)  # both addresses' cooldowns refill
        started = time.monotonic()
        logs = await asyncio.gather(
            _attack(base_url, returning, rounds, spacing, 10),
            _attack(base_url, waiting, rounds, spacing, 30),
        )
        took = time.monotonic() - started
        anonymous = await _ask(fresh, returning)
        with_device = await _ask(device, returning)
        device_code = latest_code(mail, returning)
        signed_in = await _try(device, returning, device_code)
        midway_verify = await _try(midway, waiting, own_code)
    print(f"attack: {rounds} rounds in {took:.0f} s against each address")
    for line in logs[0]:
        print("  " + line)
    status, retry = anonymous
    print(f"victim, new browser:      /code {status}, Retry-After {retry or '-'}")
    status, retry = with_device
    print(f"victim, signed-in device: /code {status}, then /verify {signed_in}")
    print(f"victim who asked before the attack: /verify {midway_verify}")


def main() -> None:
    """Start Redis, the SMTP catcher and `serve` with default limits; measure."""
    parser = argparse.ArgumentParser(description="Measure issue 15's lockout.")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spacing", type=float, default=61.0, help="seconds")
    args = parser.parse_args()
    with (
        RedisServer() as redis,
        MailCatcher() as mail,
        tempfile.TemporaryDirectory() as media,
    ):
        variables = {
            "STUDIO_REDIS_URL": redis.url,
            "STUDIO_SECRET_KEY": TEST_SECRET,
            "STUDIO_SMTP_HOST": mail.host,
            "STUDIO_SMTP_PORT": str(mail.port),
            "STUDIO_MEDIA_DIR": media,
        }
        with running("serve", variables) as (base_url, _):
            asyncio.run(measure(base_url, redis.url, mail, args.rounds, args.spacing))


if __name__ == "__main__":
    main()
