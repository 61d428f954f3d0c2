"""Accounts open once per address, with the trial credits granted once."""

from __future__ import annotations

import asyncio
import json

from redis.asyncio import Redis

from service.auth.accounts import AccountStore, address_index_key
from service.auth.identity import Keyring, address_key, key_id
from service.studio.ledger import Ledger, account_key

from .conftest import TEST_SECRET


def _store(redis: Redis, trial: int = 100) -> tuple[AccountStore, Ledger]:
    ledger = Ledger(redis, trial_credits=trial, expire_months=24)
    return AccountStore(redis, ledger, Keyring(TEST_SECRET)), ledger


async def test_ten_concurrent_first_opens_give_one_account_and_one_grant(
    redis: Redis,
) -> None:
    """Racing first verifies of a new address open a single account."""
    store, _ = _store(redis)
    results = await asyncio.gather(*(store.open("race@example.com") for _ in range(10)))
    assert sum(opened for _, opened in results) == 1
    assert len({account.id for account, _ in results}) == 1
    assert all(account.credits == 100 for account, _ in results)
    account_id = results[0][0].id
    entries = await redis.lrange(account_key(account_id) + ":ledger", 0, -1)
    assert [json.loads(e)["kind"] for e in entries] == ["grant"]


async def test_an_existing_account_keeps_its_credits(redis: Redis) -> None:
    """Opening again never grants again, even after the balance moved."""
    store, ledger = _store(redis)
    account, _ = await store.open("spent@example.com")
    assert await ledger.adjust(account.id, -40, "test") == 60
    again, opened = await store.open("spent@example.com")
    assert not opened
    assert again.credits == 60
    assert again.id == account.id


async def test_a_crash_between_the_two_steps_is_completed_by_the_next_sign_in(
    redis: Redis,
) -> None:
    """An address index without its account gets the account (and its grant) later."""
    store, _ = _store(redis)
    hmac = address_key("late@example.com", TEST_SECRET)
    await redis.set(address_index_key(hmac, key_id(TEST_SECRET)), "orphanid0000")
    account, opened = await store.open("late@example.com")
    assert opened
    assert account.id == "orphanid0000"
    assert account.credits == 100


async def test_account_keys_carry_one_hash_tag() -> None:
    """Keys are ready for Redis Cluster: one {tag} per owner."""
    assert account_key("u1") == "studio:acct:{u1}"
    kid = key_id(TEST_SECRET)
    assert address_index_key("c" * 32, kid) == f"studio:email:{kid}:{{{'c' * 32}}}"
