"""Accounts open once per address, with the trial credits granted once."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis

from service.auth.accounts import AccountStore, account_key


async def test_ten_concurrent_first_opens_give_one_account_and_one_grant(
    redis: Redis,
) -> None:
    """Racing first verifies of a new address open a single account."""
    store = AccountStore(redis, trial_credits=100)
    results = await asyncio.gather(
        *(store.open("a" * 32, "race@example.com") for _ in range(10))
    )
    assert sum(opened for _, opened in results) == 1
    assert len({account.id for account, _ in results}) == 1
    assert all(account.credits == 100 for account, _ in results)
    fields = await redis.hgetall(account_key("a" * 32))
    assert fields[b"credits"] == b"100"


async def test_an_existing_account_keeps_its_credits(redis: Redis) -> None:
    """Opening again never grants again, even after the balance moved."""
    store = AccountStore(redis, trial_credits=100)
    account, _ = await store.open("b" * 32, "spent@example.com")
    await redis.hincrby(account_key("b" * 32), "credits", -40)
    again, opened = await store.open("b" * 32, "spent@example.com")
    assert not opened
    assert again.credits == 60
    assert again.id == account.id


async def test_account_keys_carry_one_hash_tag() -> None:
    """Keys are ready for Redis Cluster: one {tag} per owner."""
    key = account_key("c" * 32)
    assert key == "studio:user:{" + "c" * 32 + "}"
