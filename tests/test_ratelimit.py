"""The GCRA script and the limiter, against a real Redis, with injected time."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
import redis as sync_redis
from hypothesis import HealthCheck, given, settings, strategies as st
from redis.asyncio import BlockingConnectionPool, Redis
from redis.crc import key_slot
from redis.exceptions import ResponseError

from service.limits.limiter import (
    DECISION_BUDGET_SECONDS,
    GCRA_BATCH_SCRIPT,
    GCRA_SCRIPT,
    MICROS,
    Breaker,
    Limiter,
    LimiterUnavailable,
    LocalBuckets,
    Policy,
    bucket_key,
)
from service.store.embedded import RedisServer
from service.store.wire import Wire

from .conftest import collector_paused
from .ports import free_port

HOUR_US = 3_600_000_000
NOW = 1_763_726_460_000_000


@pytest.fixture
async def wide_redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    """A client with a pool wide enough for thousands of concurrent calls."""
    client = Redis(
        connection_pool=BlockingConnectionPool.from_url(
            redis_server.url, max_connections=64, timeout=30
        )
    )
    await client.flushdb()
    yield client
    await client.aclose(close_connection_pool=True)


async def test_2000_concurrent_calls_on_a_bucket_of_100_allow_exactly_100(
    wide_redis: Redis,
) -> None:
    """Burst is exact under concurrency; the remaining counts prove serialisation."""
    script = wide_redis.register_script(GCRA_SCRIPT)
    key = bucket_key("test:burst", Policy("burst", 101, 3600, 100))
    replies = await asyncio.gather(
        *(script(keys=[key], args=[NOW, 100, HOUR_US, 1]) for _ in range(2000))
    )
    allowed = [reply for reply in replies if reply[0] == 1]
    assert len(allowed) == 100
    assert sorted(reply[1] for reply in allowed) == list(range(100))
    denied = [reply for reply in replies if reply[0] == 0]
    assert all(reply[1] == 0 and 0 < reply[2] <= HOUR_US for reply in denied)


def _hammer(url: str, calls: int) -> int:
    client = sync_redis.Redis.from_url(url)
    script = client.register_script(GCRA_SCRIPT)
    allowed = sum(
        script(keys=["studio:rl:v1:{test:procs}:p"], args=[NOW, 1000, HOUR_US, 1])[0]
        for _ in range(calls)
    )
    client.close()
    return int(allowed)


def test_four_processes_on_a_bucket_of_1000_allow_exactly_1000(
    redis_server: RedisServer,
) -> None:
    """Exact across processes sharing one Redis."""
    sync_redis.Redis.from_url(redis_server.url).delete("studio:rl:v1:{test:procs}:p")
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        counts = pool.starmap(_hammer, [(redis_server.url, 750)] * 4)
    assert sum(counts) == 1000


@dataclass
class Model:
    """A pure-Python integer model of the script."""

    tats: dict[str, int]

    def call(
        self, keys: list[str], now: int, buckets: list[tuple[int, int, int]]
    ) -> list[int]:
        rows = []
        ok = True
        for key, (b, t, c) in zip(keys, buckets, strict=True):
            tat = min(max(self.tats.get(key, now), now), now + b * t)
            rows.append((key, b, t, c, tat, tat + c * t))
            if tat + c * t - now > b * t:
                ok = False
        out = [1 if ok else 0]
        for key, b, t, c, tat, new in rows:
            tau, debt, retry = b * t, tat - now, -1
            if ok:
                debt = new - now
                if c > 0:
                    self.tats[key] = new
            elif new - now <= tau:
                retry = 0
            elif c > b:
                retry = -2
            else:
                retry = new - tau - now
            out += [(tau - debt) // t, retry, debt]
        return out


_bucket = st.tuples(st.integers(1, 5), st.integers(1, 10_000))
_step = st.tuples(
    st.integers(0, 30_000), st.lists(st.integers(0, 7), min_size=3, max_size=3)
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(_bucket, min_size=1, max_size=3), st.lists(_step, min_size=1, max_size=40)
)
def test_the_script_matches_an_integer_model_step_by_step(
    redis_server: RedisServer,
    buckets: list[tuple[int, int]],
    steps: list[tuple[int, list[int]]],
) -> None:
    """Every reply equals the model's, for random buckets, gaps and costs."""
    client = sync_redis.Redis.from_url(redis_server.url)
    script = client.register_script(GCRA_SCRIPT)
    keys = [f"studio:rl:v1:{{test:model}}:b{i}" for i in range(len(buckets))]
    client.delete(*keys)
    model = Model({})
    now = NOW
    try:
        for gap, costs in steps:
            now += gap
            spec = [(b, t, costs[i]) for i, (b, t) in enumerate(buckets)]
            args = [now] + [x for triple in spec for x in triple]
            # A key's PX runs on Redis's real clock while this test's clock stands
            # still: persisting it in the same transaction keeps a busy machine's
            # slowness out of the comparison (the PX has its own test below).
            transaction = client.pipeline(transaction=True)
            script(keys=keys, args=args, client=transaction)
            for key in keys:
                transaction.persist(key)
            reply = [int(x) for x in transaction.execute()[0]]
            assert reply == model.call(keys, now, spec)
            for key in keys:  # expiry is "full": a missing key is an idle bucket
                if key not in model.tats or model.tats[key] <= now:
                    model.tats.pop(key, None)
    finally:
        client.close()


async def test_retry_after_is_exact_to_the_microsecond(redis: Redis) -> None:
    """Denied at now+R-1, allowed at now+R; a thousand denials consume nothing."""
    script = redis.register_script(GCRA_SCRIPT)
    key = "studio:rl:v1:{test:edge}:p"
    args = [2, 1_000_000, 1]
    for _ in range(2):
        assert (await script(keys=[key], args=[NOW, *args]))[0] == 1
    denied = await script(keys=[key], args=[NOW, *args])
    retry = denied[2]
    assert denied[0] == 0
    assert retry == 1_000_000
    for _ in range(1000):
        assert (await script(keys=[key], args=[NOW + retry - 1, *args]))[0] == 0
    assert (await script(keys=[key], args=[NOW + retry, *args]))[0] == 1


async def test_a_subject_is_all_or_nothing_across_its_policies(redis: Redis) -> None:
    """One exhausted bucket denies the call and leaves its siblings untouched."""
    script = redis.register_script(GCRA_SCRIPT)
    keys = [f"studio:rl:v1:{{test:group}}:{name}" for name in ("a", "b", "c")]
    await script(keys=[keys[2]], args=[NOW, 1, HOUR_US, 1])  # exhaust c
    before = [await redis.get(key) for key in keys]
    reply = await script(
        keys=keys, args=[NOW, 5, HOUR_US, 1, 5, HOUR_US, 1, 1, HOUR_US, 1]
    )
    assert reply[0] == 0
    assert [reply[2], reply[5]] == [0, 0]  # a and b would have allowed
    assert reply[8] > 0
    assert [await redis.get(key) for key in keys] == before


async def test_zero_cost_peeks_and_oversized_cost_never_passes(redis: Redis) -> None:
    """cost 0 writes nothing; cost > capacity answers retry -2 and writes nothing."""
    script = redis.register_script(GCRA_SCRIPT)
    key = "studio:rl:v1:{test:edges}:p"
    peek = await script(keys=[key], args=[NOW, 3, 1000, 0])
    assert peek[:2] == [1, 3]
    assert not await redis.exists(key)
    never = await script(keys=[key], args=[NOW, 3, 1000, 4])
    assert never[0] == 0
    assert never[2] == -2
    assert not await redis.exists(key)


async def test_the_key_expires_exactly_when_the_bucket_is_full(redis: Redis) -> None:
    """PX is the debt in ms, so a missing key always means a full bucket."""
    script = redis.register_script(GCRA_SCRIPT)
    key = "studio:rl:v1:{test:px}:p"
    reply = await script(keys=[key], args=[NOW, 5, 2_000_000, 1])
    assert 0 < await redis.pttl(key) <= -(-reply[3] // 1000)


def test_keys_of_a_subject_share_one_hash_tag_and_slot() -> None:
    """Cluster-safe: one {subject} per key, one slot per subject."""
    policies = [Policy(n, 10, 60, 5) for n in ("x", "y", "z")]
    keys = [bucket_key("ip6:2001:db8::/64", p) for p in policies]
    assert all(k.count("{") == 1 and "{ip6:2001:db8::/64}" in k for k in keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1


@pytest.mark.parametrize(
    ("quota", "window", "burst"),
    [(10, 60, 0), (10, 0, 5), (5, 60, 6), (5, 60, 5), (2**40, 1, 2**40 - 1)],
)
def test_impossible_policies_are_refused(quota: int, window: int, burst: int) -> None:
    """Validation at start-up: bursts, windows, cooldowns and the 2^53 bound."""
    with pytest.raises(ValueError, match="policy"):
        Policy("p", quota, window, burst if burst else 0)


def test_the_interval_keeps_the_advertised_quota() -> None:
    """T = ceil(w / (q - B)): at most q requests in any window w."""
    gallery = Policy("gallery", 120, 60, 60)
    assert gallery.interval_us == 1_000_000
    assert gallery.burst + (60 * 1_000_000) // gallery.interval_us <= gallery.quota
    assert Policy("cooldown", 1, 60, 1).interval_us == 60_000_000


async def test_the_limiter_uses_redis_time_and_recovers_after_the_interval(
    redis: Redis, redis_server: RedisServer
) -> None:
    """Production calls pass no clock: allowed, denied, allowed again after T."""
    limiter = Limiter.from_url(redis_server.url)
    # T = 1 s: the denial holds however slowly a busy machine runs the next call.
    quick = Policy("quick", 2, 1, 1)
    try:
        assert (await limiter.check("test:time", [quick])).allowed
        denied = await limiter.check("test:time", [quick])
        assert not denied.allowed
        assert denied.retry_after == 1
        # Redis's clock runs on while we wait the retry time it gave (and 10 ms for
        # its wall clock against our monotonic one).
        await asyncio.sleep(denied.worst_retry_us / MICROS + 0.01)
        assert (await limiter.check("test:time", [quick])).allowed
    finally:
        await limiter.aclose()


@pytest.mark.timing  # a wall-clock budget: run alone, after the parallel part
async def test_a_remembered_denial_costs_no_redis_round_trip(
    redis: Redis, redis_server: RedisServer
) -> None:
    """After one denial, a flood is answered in process until the retry time."""
    limiter = Limiter.from_url(redis_server.url)
    policy = Policy("flood", 2, 3600, 1)
    try:
        await limiter.check("test:flood", [policy])
        assert not (await limiter.check("test:flood", [policy])).allowed
        before = int((await redis.info("stats"))["total_commands_processed"])
        for _ in range(200):
            decision = await limiter.check("test:flood", [policy])
            assert not decision.allowed
            assert decision.retry_after > 3500
        after = int((await redis.info("stats"))["total_commands_processed"])
        assert after - before == 1  # only our own INFO
    finally:
        await limiter.aclose()


async def test_the_limiter_survives_a_script_flush(
    redis: Redis, redis_server: RedisServer
) -> None:
    """EVALSHA reloads the script after SCRIPT FLUSH."""
    limiter = Limiter.from_url(redis_server.url)
    try:
        await limiter.check("test:flush", [Policy("f", 10, 60, 5)])
        await redis.script_flush()
        assert (await limiter.check("test:flush", [Policy("f", 10, 60, 5)])).allowed
    finally:
        await limiter.aclose()


async def test_a_dead_redis_fails_fast_and_opens_the_breaker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Against a closed port: LimiterUnavailable within 100 ms, then no calls at all."""
    limiter = Limiter.from_url(f"redis://127.0.0.1:{free_port()}/0")
    limiter.breaker = Breaker(threshold=3, cooldown=60)
    policy = Policy("dead", 10, 60, 5)
    asked = 0
    call = Wire.call

    async def counted(wire: Wire, *args: Any) -> Any:
        nonlocal asked
        asked += 1
        return await call(wire, *args)

    monkeypatch.setattr(Wire, "call", counted)
    try:
        for _ in range(3):
            with collector_paused():
                started = time.monotonic()
                with pytest.raises(LimiterUnavailable):
                    await limiter.check("test:dead", [policy])
                assert time.monotonic() - started < DECISION_BUDGET_SECONDS
        assert asked == 3
        assert limiter.breaker.opened_at is not None
        with pytest.raises(LimiterUnavailable):
            await limiter.check("test:dead", [policy])
        assert asked == 3  # the open breaker answered without Redis
        assert not limiter.breaker.allow()
        limiter.breaker.opened_at -= limiter.breaker.cooldown  # the cooldown passes
        assert limiter.breaker.allow()  # half-open: one call may try again
        assert not limiter.breaker.allow()  # and only one
    finally:
        await limiter.aclose()


def test_the_local_fallback_bucket_behaves_like_the_script() -> None:
    """Burst, then denial with an exact retry, all-or-nothing."""
    local = LocalBuckets()
    policy = Policy("local", 20, 3600, 10)
    decisions = [local.check("ip4:1.2.3.4", [policy]) for _ in range(11)]
    assert [d.allowed for d in decisions] == [True] * 10 + [False]
    assert [d.states[0].remaining for d in decisions[:10]] == list(range(9, -1, -1))
    assert 0 < decisions[-1].retry_after <= 360
    assert local.check("ip4:5.6.7.8", [policy]).allowed


def test_the_fallback_continues_from_what_redis_last_said() -> None:
    """A spent bucket stays spent when Redis goes away: no fresh burst."""
    local = LocalBuckets()
    policy = Policy("seeded", 20, 3600, 10)
    spent = LocalBuckets().check("ip4:9.9.9.9", [policy], cost=10)
    local.observe("ip4:9.9.9.9", spent)
    assert not local.check("ip4:9.9.9.9", [policy]).allowed


def test_the_fallback_keeps_at_most_its_subjects_the_least_recent_leaving() -> None:
    """An outage seen by many addresses grows no table: the oldest subject leaves.

    Its next request starts from a full bucket again, as an unseen subject does.
    """
    local = LocalBuckets(max_subjects=2)
    policy = Policy("bounded", 1, 3600, 1)
    assert local.check("ip4:1.1.1.1", [policy]).allowed
    assert not local.check("ip4:1.1.1.1", [policy]).allowed  # spent, remembered
    assert local.check("ip4:2.2.2.2", [policy]).allowed
    assert local.check("ip4:3.3.3.3", [policy]).allowed  # 1.1.1.1 leaves
    assert local.check("ip4:1.1.1.1", [policy]).allowed
    assert not local.check("ip4:3.3.3.3", [policy]).allowed  # still remembered


async def test_a_key_read_along_shares_the_decisions_round_trip(
    redis: Redis, redis_server: RedisServer
) -> None:
    """Decisions of one turn and the key they read along cost one script run."""
    limiter = Limiter.from_url(redis_server.url)
    wide = Policy("wide", 100, 60, 50)
    await redis.set("test:along", b"7")
    try:
        await limiter.check("test:warm", [wide])  # script loaded, connection open
        before = await redis.info("commandstats")
        results = await asyncio.gather(
            *(
                limiter.check_reading(f"test:along{i}", [wide], "test:along")
                for i in range(10)
            )
        )
        after = await redis.info("commandstats")
    finally:
        await limiter.aclose()
    assert all(decision.allowed and value == b"7" for decision, value in results)

    def calls(name: str) -> int:
        return int(after[name]["calls"]) - int(before.get(name, {"calls": 0})["calls"])

    # one script run decides all ten, GETting each bucket, and reads the key
    # along once, not ten times
    assert calls("cmdstat_evalsha") == 1
    assert calls("cmdstat_get") == 10 + 1


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3), st.lists(st.integers(0, 3), min_size=1, max_size=3)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_batch_decides_each_call_as_the_script_would_one_after_another(
    redis_server: RedisServer, calls: list[tuple[int, list[int]]]
) -> None:
    """Calls on the same and on different subjects, in one script run or one by
    one; the keys it reads come after the decisions."""
    client = sync_redis.Redis.from_url(redis_server.url)
    single = client.register_script(GCRA_SCRIPT)
    batch = client.register_script(GCRA_BATCH_SCRIPT)
    client.flushdb()
    client.set("test:read", b"7")
    try:
        keys: list[str] = []
        args: list[int | str] = [NOW, len(calls), 2]
        expected: list[Any] = []
        for subject, costs in calls:
            call_keys = [f"studio:rl:v1:{{s{subject}}}:p{i}" for i in range(len(costs))]
            call_args = [x for cost in costs for x in (3, 1_000_000, cost)]
            keys += call_keys
            args += [len(call_keys), *call_args]
            expected.append(
                single(keys=[f"one:{k}" for k in call_keys], args=[NOW, *call_args])
            )
        got = batch(keys=[*keys, "test:read", "test:none"], args=args)
        assert got == [*expected, b"7", None]
    finally:
        client.close()


async def test_a_bad_batch_is_refused_whole(redis: Redis) -> None:
    """Keys or arguments that do not add up to the calls they name decide nothing."""
    batch = redis.register_script(GCRA_BATCH_SCRIPT)
    key = "studio:rl:v1:{test:bad}:p"
    cases: list[tuple[list[str], list[int | str]]] = [
        ([key], [NOW, 2, 0, 1, 3, 1000, 1]),  # names two calls, holds one
        ([key, key], [NOW, 1, 0, 1, 3, 1000, 1]),  # a key left over
        ([key], [NOW, 1, 1, 1, 3, 1000, 1]),  # a key to read missing
        ([key], [NOW, 1, 0, 1, 3, 1000, 1, 9]),  # an argument left over
        ([key], [NOW, "x", 0]),
    ]
    for keys, args in cases:
        with pytest.raises(ResponseError, match="rl: bad arity"):
            await batch(keys=keys, args=args)
    assert not await redis.exists(key)


async def test_decisions_with_their_own_clocks_in_one_turn_keep_them(
    redis_server: RedisServer,
) -> None:
    """Tests inject `now`; calls of one turn at different times are not merged."""
    limiter = Limiter.from_url(redis_server.url)
    policy = Policy("clock", 2, 3600, 1)  # one at once, the next after an hour
    try:
        first, same_time, hour_later = await asyncio.gather(
            limiter.check("test:clock", [policy], now_us=NOW),
            limiter.check("test:clock", [policy], now_us=NOW),
            limiter.check("test:clock", [policy], now_us=NOW + HOUR_US),
        )
    finally:
        await limiter.aclose()
    assert (first.allowed, same_time.allowed, hour_later.allowed) == (True, False, True)
    assert same_time.retry_after == 3600
