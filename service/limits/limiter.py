"""Token buckets in Redis (GCRA form): exact under concurrency, one round trip."""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from collections import OrderedDict
from collections.abc import Sequence, Set
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Final

from redis.asyncio import Redis
from redis.crc import key_slot
from redis.exceptions import (
    NoScriptError,
    RedisClusterException,
    RedisError,
    ResponseError,
)

from ..store.connect import connect, is_cluster
from ..store.deadline import PATIENCE, Deadline, counted_from_send, within
from ..store.wire import Wire, wire_of

_LUA: Final = Path(__file__).parent / "lua"
GCRA_SCRIPT: Final = (_LUA / "gcra.lua").read_text()
# The limiter's one script: a turn's decisions, each run through gcra.lua.
GCRA_BATCH_SCRIPT: Final = "".join(
    (
        "local function gcra(KEYS, ARGV)\n",
        GCRA_SCRIPT,
        "\nend\n",
        (_LUA / "gcra_batch.lua").read_text(),
    )
)
REFUND_SCRIPT: Final = (_LUA / "refund.lua").read_text()
_NAME: Final = re.compile(r"^[a-z][a-z0-9-]*$")
_SUBJECT: Final = re.compile(r"^[A-Za-z0-9:./_-]+$")
MICROS: Final = 1_000_000
# A decision never waits longer than this for Redis (see Deadline for how a busy
# event loop's own delays are kept out of it).
DECISION_BUDGET_SECONDS: Final = 0.1
# The client's own timeouts only free connections to a hung server: they run on
# plain loop timers, which a stalled loop fires late over replies already read.
CLIENT_BACKSTOP_SECONDS: Final = DECISION_BUDGET_SECONDS * PATIENCE
# Connections of the limiter's pool.
POOL_SIZE: Final = 16
# Decisions that arrive in the same event-loop turn share one script run (one per
# slot on a cluster) and one round trip.
MAX_BATCH: Final = 256


MemoKey = tuple[str, tuple[str, ...]]


class LimiterUnavailable(Exception):
    """Redis could not answer in time, or the breaker is open."""


@dataclass(frozen=True, slots=True)
class Policy:
    """At most `quota` requests in any `window` seconds, `burst` of them at once.

    The emission interval is T = ceil(window / (quota - burst)), so the bucket
    admits at most burst + floor(L / T) requests in any interval L, which is at
    most `quota` for L = window: the advertised `q;w` is a promise we keep. A
    cooldown is quota = burst = 1 with T = window.
    """

    name: str
    quota: int
    window: int
    burst: int
    # T, the µs it takes one token to come back: computed once, read per request
    interval_us: int = field(init=False, repr=False, compare=False)
    # this policy in RateLimit-Policy, rendered once
    rendered: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"policy name {self.name!r} must match {_NAME.pattern}")
        if self.window < 1 or self.burst < 1 or self.quota < self.burst:
            raise ValueError(
                f"policy {self.name}: need 1 <= burst <= quota, window >= 1"
            )
        if self.quota == self.burst and self.quota != 1:
            raise ValueError(
                f"policy {self.name}: burst == quota only for a cooldown of 1"
            )
        interval = -(-self.window * MICROS // max(1, self.quota - self.burst))
        if self.burst * interval >= 2**53:
            raise ValueError(f"policy {self.name}: burst x interval exceeds 2^53 µs")
        object.__setattr__(self, "interval_us", interval)
        rendered = f'"{self.name}";q={self.quota};w={self.window}'
        object.__setattr__(self, "rendered", rendered)

    def header(self) -> str:
        """Render this policy for RateLimit-Policy."""
        return self.rendered


# BucketState and Decision are built for every limited request, and a frozen
# dataclass's __init__ costs 2.5 times a plain one's: they are plain, and
# nothing changes them once built (refunded and shifted build new ones).
@dataclass(slots=True)
class BucketState:
    """One policy's answer: tokens left, µs until it would pass, µs until full."""

    policy: Policy
    remaining: int
    retry_us: int
    reset_us: int

    @property
    def denied(self) -> bool:
        """Tell whether this bucket refused the request."""
        return self.retry_us > 0

    def refunded(self, cost: int = 1) -> BucketState:
        """This bucket once `cost` tokens are given back (never past full)."""
        policy = self.policy
        return BucketState(
            policy,
            min(policy.burst, self.remaining + cost),
            self.retry_us,
            max(0, self.reset_us - cost * policy.interval_us),
        )

    def header(self) -> str:
        """Render this bucket for RateLimit (draft -10): r, and t to the next token."""
        policy = self.policy
        if self.remaining >= policy.burst:
            return f'"{policy.name}";r={self.remaining}'
        next_us = (
            self.reset_us - (policy.burst - self.remaining - 1) * policy.interval_us
        )
        seconds = max(0, math.ceil(next_us / MICROS))
        return f'"{policy.name}";r={self.remaining};t={seconds}'


@dataclass(slots=True)
class Decision:
    """All of one subject's buckets, decided together."""

    allowed: bool
    states: tuple[BucketState, ...]
    # µs until every denying bucket would let the request pass (none if allowed)
    worst_retry_us: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not self.allowed:
            self.worst_retry_us = max(
                (s.retry_us for s in self.states if s.denied), default=0
            )

    def refunded(self, names: Set[str]) -> Decision:
        """This decision once the named policies' tokens are given back."""
        states = tuple(
            state.refunded() if state.policy.name in names else state
            for state in self.states
        )
        return Decision(self.allowed, states)

    @property
    def retry_after(self) -> int:
        """Return whole seconds until the request could pass: rounded up."""
        return max(1, math.ceil(self.worst_retry_us / MICROS))


def bucket_key(subject: str, policy: Policy) -> str:
    """Name a bucket; the subject is the hash tag, so one subject is one slot."""
    return f"studio:rl:v1:{{{subject}}}:{policy.name}"


class LocalBuckets:
    """The same GCRA in process memory: the fallback when Redis is unreachable.

    Every answer Redis gives is copied in, so a fallback continues from the
    shared state instead of handing out a fresh burst.
    """

    def __init__(self, max_subjects: int = 10_000) -> None:
        self._tats: OrderedDict[str, int] = OrderedDict()
        self._max = max_subjects

    def observe(
        self, subject: str, decision: Decision, keys: Sequence[str] = ()
    ) -> None:
        """Copy Redis's view of a subject's buckets (µs until full) into memory.

        `keys`, the buckets' keys in the decision's order, if the caller has them.
        """
        now, tats = time.monotonic_ns() // 1000, self._tats
        if not keys:
            keys = [bucket_key(subject, state.policy) for state in decision.states]
        for key, state in zip(keys, decision.states, strict=True):
            tats[key] = now + state.reset_us
            tats.move_to_end(key)
        if len(tats) > self._max:
            self._trim()

    def _trim(self) -> None:
        while len(self._tats) > self._max:
            self._tats.popitem(last=False)

    def check(
        self, subject: str, policies: Sequence[Policy], cost: int = 1
    ) -> Decision:
        """Decide like the script does, all-or-nothing, with this process's clock."""
        now = time.monotonic_ns() // 1000
        rows = []
        for policy in policies:
            key = bucket_key(subject, policy)
            tau = policy.burst * policy.interval_us
            tat = min(max(self._tats.get(key, now), now), now + tau)
            rows.append((policy, key, tau, tat, tat + cost * policy.interval_us))
        allowed = all(new - now <= tau for _, _, tau, _, new in rows)
        states = []
        for policy, key, tau, tat, new in rows:
            debt, retry = tat - now, -1
            if allowed:
                debt = new - now
                if cost > 0:
                    self._tats[key] = new
                    self._tats.move_to_end(key)
            elif new - now <= tau:
                retry = 0
            else:
                retry = new - tau - now
            states.append(
                BucketState(policy, (tau - debt) // policy.interval_us, retry, debt)
            )
        self._trim()
        return Decision(allowed, tuple(states))


@dataclass
class Breaker:
    """Stop calling a failing Redis for a while, then let one call try again."""

    threshold: int = 5
    cooldown: float = 2.0
    failures: int = 0
    opened_at: float | None = None
    trying: bool = False

    def allow(self) -> bool:
        """Tell whether a call may go to Redis now (one trial once cooled down)."""
        if self.opened_at is None:
            return True
        if self.trying or time.monotonic() - self.opened_at < self.cooldown:
            return False
        self.trying = True
        return True

    def record(self, ok: bool) -> None:
        """Count a success (closes) or a failure (opens, or re-opens after a trial)."""
        self.trying = False
        if ok:
            self.failures, self.opened_at = 0, None
            return
        self.failures += 1
        if self.failures >= self.threshold:
            self.opened_at = time.monotonic()


@dataclass
class _Batcher:
    """Decide the calls of one event-loop turn in one script run: one round trip.

    The batch script runs gcra.lua once per call, so each call is still decided
    on its own, atomically; only the script run and the network trip are
    shared: concurrent requests cost one command instead of one each. On a
    cluster a batch holds the calls of one slot, and a turn's batches go out in
    one pipeline. A caller may name a key to read along (read once per turn, in
    the same script run on a single server, by a GET beside it on a cluster): a
    value read after the caller arrived, at no extra round trip. A turn has one
    deadline, counted from when its command goes out: past it, every caller
    still waiting gets a TimeoutError at once, while the late command finishes
    on its own. A reply that came in while the loop was busy elsewhere is still
    used (see Deadline).
    """

    def __init__(
        self, redis: Redis, script: str, budget: float, wire: Wire | None
    ) -> None:
        self._redis = redis
        self._budget = budget
        self._script = script
        self._sha = hashlib.sha1(script.encode()).hexdigest()
        self._cluster = is_cluster(redis)
        # A single server's script runs go out on a connection of their own
        # (wire.py): a sixth of redis-py's CPU a round trip.
        self._wire = wire
        self._queue: list[_Call] = []
        self._loop: asyncio.AbstractEventLoop | None = None  # of the queued calls
        self._running: set[asyncio.Task[None]] = set()

    def submit(
        self, keys: list[str], args: list[int | str], read_along: str = ""
    ) -> asyncio.Future[tuple[Any, bytes | None]]:
        """Queue one decision (gcra.lua's keys and arguments); its reply and the
        read-along value arrive together."""
        # A call queued behind another is in the same turn of the same loop:
        # Python 3.11's get_running_loop makes a getpid system call, once a turn.
        loop = self._loop
        if not self._queue or loop is None:
            loop = self._loop = asyncio.get_running_loop()
            loop.call_soon(self._flush)
        future: asyncio.Future[tuple[Any, bytes | None]] = loop.create_future()
        self._queue.append((keys, args, read_along, future))
        return future

    def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
            if not self._send_now(batch):
                self._start(batch)

    def _start(self, batch: list[_Call]) -> None:
        """Decide a batch in a task of its own: it may connect, load the script,
        or send more than one command."""
        task = asyncio.ensure_future(self._run(batch))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    def _send_now(self, batch: list[_Call]) -> bool:
        """Write a batch's one script run now, on a wire already open: no task.

        This is the common turn (one server, the script loaded, the connection
        up): a task, its coroutines and a restarted deadline cost a limited
        request about 7 µs of CPU here. Its deadline counts from the write.
        """
        clock = batch[0][1][0]
        if self._wire is None or any(args[0] != clock for _, args, _, _ in batch):
            return False  # no wire, or test clocks that need runs of their own
        reads = _reads(batch)
        if (reply := self._wire.send(*self._evalsha(batch, reads))) is None:
            return False
        futures = [future for *_, future in batch]
        deadline = Deadline(self._budget, partial(self._expire, futures))
        reply.add_done_callback(partial(self._answered, batch, reads, deadline))
        return True

    def _answered(
        self,
        batch: list[_Call],
        reads: list[str],
        deadline: Deadline,
        reply: asyncio.Future[Any],
    ) -> None:
        """Hand out a batch's replies as they came on the wire."""
        deadline.cancel()
        if reply.cancelled():  # the wire closed under it
            error: BaseException | None = ConnectionError("the wire closed")
        else:
            error = reply.exception()
        if isinstance(error, NoScriptError):
            self._start(batch)  # the task loads the script and sends again
        elif error is not None:
            self._deliver([batch], [error], {})
        else:
            self._deliver([batch], *_split(reply.result(), len(batch), reads))

    def _scripts(self, batch: list[_Call]) -> list[list[_Call]]:
        """Split a turn's calls into script runs: one per slot and injected clock."""
        runs: dict[tuple[int, int | str], list[_Call]] = {}
        for call in batch:
            keys, args, *_ = call
            slot = key_slot(keys[0].encode()) if self._cluster else 0
            runs.setdefault((slot, args[0]), []).append(call)
        return list(runs.values())

    async def _run(self, batch: list[_Call]) -> None:
        # The budget counts from the command's write (counted_from_send), not from
        # when the batch was queued: a loop too busy to start this task or to
        # write has not waited on Redis. A write that never happens still ends
        # at the first budget.
        futures = [future for *_, future in batch]
        deadline = Deadline(self._budget, partial(self._expire, futures))
        runs = self._scripts(batch)
        reads = _reads(batch)
        try:
            with counted_from_send(deadline):  # from the write, as `within`
                replies, values = await self._send(runs, reads)
            if any(isinstance(r, NoScriptError) for r in replies):
                if self._wire is not None:
                    await self._wire.call("SCRIPT", "LOAD", self._script)
                else:
                    await self._redis.script_load(self._script)
                replies, values = await self._send(runs, reads)
        except Exception as err:
            replies, values = [err] * len(runs), {}
        finally:
            deadline.cancel()
        self._deliver(runs, replies, values)

    def _deliver(
        self, runs: list[list[_Call]], replies: list[Any], values: dict[str, Any]
    ) -> None:
        """Give each caller still waiting its reply (or its run's error)."""
        # A value Redis could not read is given as None, like a missing one.
        read = {k: None if isinstance(v, Exception) else v for k, v in values.items()}
        for run, run_reply in zip(runs, replies, strict=True):
            failed = isinstance(run_reply, Exception)
            for index, (_, _, key, future) in enumerate(run):
                if future.done():
                    continue  # its caller gave up at the deadline
                reply = run_reply if failed else run_reply[index]
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result((reply, read.get(key)))

    async def _send(
        self, runs: list[list[_Call]], reads: list[str]
    ) -> tuple[list[Any], dict[str, Any]]:
        """Send a turn's script runs and reads; return each run's replies and the
        values read.

        On a single server the first run also reads the keys, so a turn is
        usually one command, sent without a pipeline; a cluster's reads are
        GETs beside the runs, as the keys may be on other slots.
        """
        folded = [] if self._cluster else reads
        commands = [
            self._evalsha(run, folded if index == 0 else [])
            for index, run in enumerate(runs)
        ]
        commands += [("GET", key) for key in reads if self._cluster]
        if len(commands) == 1:
            try:
                if self._wire is not None:
                    replies = [await self._wire.call(*commands[0])]
                else:
                    replies = [await self._redis.execute_command(*commands[0])]  # type: ignore[no-untyped-call]
            except ResponseError as err:  # NoScriptError among them
                replies = [err]
        else:
            async with self._redis.pipeline(transaction=False) as pipe:
                for command in commands:
                    # execute_command: ClusterPipeline blocks its evalsha
                    # method but routes a raw EVALSHA by its keys' slot.
                    pipe.execute_command(*command)
                replies = list(await pipe.execute(raise_on_error=False))
        if self._cluster:
            return replies[: len(runs)], dict(
                zip(reads, replies[len(runs) :], strict=True)
            )
        first = replies[0]
        if isinstance(first, Exception):
            return replies, {}
        ([replies[0]], values) = _split(first, len(runs[0]), reads)
        return replies, values

    def _expire(self, futures: list[asyncio.Future[Any]]) -> None:
        """Fail a batch's callers still waiting; leave a connection that is late."""
        for future in futures:
            if not future.done():
                future.set_exception(TimeoutError("limiter decision over budget"))
        if self._wire is not None:
            self._wire.drop()

    async def aclose(self) -> None:
        """Close the batches' own connection, if they have one."""
        if self._wire is not None:
            await self._wire.aclose()

    def _evalsha(self, run: list[_Call], reads: list[str]) -> tuple[Any, ...]:
        """One EVALSHA of the batch script: a run's decisions, then keys to GET."""
        keys: list[str] = []
        args: list[int | str] = [run[0][1][0], len(run), len(reads)]
        for call_keys, call_args, _, _ in run:
            keys += call_keys
            args.append(len(call_keys))
            args += call_args[1:]
        keys += reads
        return ("EVALSHA", self._sha, len(keys), *keys, *args)


# One queued decision: gcra.lua's keys and arguments, a key to read along (or
# ""), its future.
_Call = tuple[
    list[str], list[int | str], str, "asyncio.Future[tuple[Any, bytes | None]]"
]


@dataclass
class Limiter:
    """Decide a subject's policies in one EVALSHA; fail fast; remember denials."""

    redis: Redis
    breaker: Breaker = field(default_factory=Breaker)
    local: LocalBuckets = field(default_factory=LocalBuckets)
    # The decisions' connection (wire.py): the one beside `redis`'s pool if not
    # given; None where there is none (TLS, a cluster): they go through redis-py.
    wire: Wire | None = None
    # (subject, policy names) -> (monotonic time of the denial, the denial)
    _denials: dict[MemoKey, tuple[float, Decision]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.wire is None:
            self.wire = wire_of(self.redis)
        self._batcher = _Batcher(
            self.redis, GCRA_BATCH_SCRIPT, DECISION_BUDGET_SECONDS, self.wire
        )
        self._refund = self.redis.register_script(REFUND_SCRIPT)

    def remembered(self, memo_key: MemoKey) -> tuple[Decision, int] | None:
        """Return a denial Redis gave that still holds, and µs since it was given."""
        if (memo := self._denials.get(memo_key)) is None:
            return None
        at, denial = memo
        elapsed_us = int((time.monotonic() - at) * MICROS)
        if elapsed_us < denial.worst_retry_us:
            return denial, elapsed_us
        del self._denials[memo_key]
        return None

    @classmethod
    def from_url(
        cls, url: str, *, cluster: bool = False, wire_class: type[Wire] = Wire
    ) -> Limiter:
        """Build a limiter with its own pool: no retries, a 100 ms budget per call.

        The budget is kept by the limiter's own deadlines; the pool's and the
        wire's timeouts are only a backstop (CLIENT_BACKSTOP_SECONDS).
        """
        redis = connect(
            url,
            cluster=cluster,
            socket_timeout=CLIENT_BACKSTOP_SECONDS,
            connect_timeout=CLIENT_BACKSTOP_SECONDS,
            retries=0,
            pool_size=POOL_SIZE,
            pool_wait=CLIENT_BACKSTOP_SECONDS,
        )
        wire = wire_of(redis) if wire_class is Wire else wire_class.for_client(redis)
        return cls(redis, wire=wire)

    async def check(
        self,
        subject: str,
        policies: Sequence[Policy],
        *,
        cost: int = 1,
        now_us: int | None = None,
    ) -> Decision:
        """Charge `cost` to every policy of a subject, or to none of them."""
        decision, _ = await self.check_reading(
            subject, policies, "", cost=cost, now_us=now_us
        )
        return decision

    async def check_reading(
        self,
        subject: str,
        policies: Sequence[Policy],
        read_along: str,
        *,
        cost: int = 1,
        now_us: int | None = None,
    ) -> tuple[Decision, bytes | None]:
        """Decide like check, and read a key in the same round trip (not on denial)."""
        if not _SUBJECT.match(subject):
            raise ValueError(f"bad subject {subject!r}")
        # No denial remembered at all (the common case): no key to build.
        if self._denials and now_us is None:
            memo_key = (subject, tuple(p.name for p in policies))
            if (memo := self.remembered(memo_key)) is not None:
                return shifted(*memo), None
        now_arg: int | str = "" if now_us is None else now_us
        if len(policies) == 1:  # most routes: no comprehension, no loop
            policy = policies[0]
            keys = [bucket_key(subject, policy)]
            args = [now_arg, policy.burst, policy.interval_us, cost]
        else:
            keys = [bucket_key(subject, p) for p in policies]
            args = [now_arg]
            for policy in policies:
                args += [policy.burst, policy.interval_us, cost]
        if not self.breaker.allow():
            raise LimiterUnavailable
        try:
            reply, value = await self._batcher.submit(keys, args, read_along)
        except (RedisError, RedisClusterException, OSError, TimeoutError) as err:
            self.breaker.record(False)
            raise LimiterUnavailable from err
        self.breaker.record(True)
        decision = _decision(policies, reply)
        if now_us is None:
            self.local.observe(subject, decision, keys)
        if not decision.allowed and now_us is None and len(policies) == 1:
            # A denied GCRA bucket cannot refill before its retry time, and a
            # denial writes nothing, so repeating it locally until then is exact.
            # Not so for the buckets beside it in a multi-policy denial: they
            # refill, and other processes spend them, so Redis is asked again.
            self._denials[subject, (policies[0].name,)] = (time.monotonic(), decision)
            if len(self._denials) > 10_000:
                self._denials.pop(next(iter(self._denials)))
        return decision, value

    async def refund(
        self, subject: str, policies: Sequence[Policy], cost: int = 1
    ) -> None:
        """Give tokens back to a subject's buckets (the request was not served)."""
        for memo_key in [key for key in self._denials if key[0] == subject]:
            del self._denials[memo_key]  # a remembered denial may no longer hold
        keys = [bucket_key(subject, p) for p in policies]
        args: list[int] = [p.interval_us for p in policies] + [cost]
        try:
            await within(DECISION_BUDGET_SECONDS, self._refund(keys=keys, args=args))
        except (RedisError, RedisClusterException, OSError, TimeoutError) as err:
            raise LimiterUnavailable from err

    async def aclose(self) -> None:
        """Close the limiter's connections."""
        await self._batcher.aclose()
        if is_cluster(self.redis):
            await self.redis.aclose()  # the cluster client owns its pools
        else:
            await self.redis.aclose(close_connection_pool=True)


def _reads(batch: list[_Call]) -> list[str]:
    """The keys a batch reads along, each once, in a fixed order."""
    return sorted({key for _, _, key, _ in batch if key})


def _split(
    reply: list[Any], calls: int, reads: list[str]
) -> tuple[list[Any], dict[str, Any]]:
    """Split a batch script's reply into its run's replies and the values read."""
    if not reads:
        return [reply], {}
    return [reply[:calls]], dict(zip(reads, reply[calls:], strict=True))


def _decision(policies: Sequence[Policy], reply: Sequence[int]) -> Decision:
    """Read gcra.lua's reply (integers: Redis replies a Lua number as one)."""
    if len(policies) == 1:  # most routes: no loop, no generator
        return Decision(
            reply[0] == 1, (BucketState(policies[0], reply[1], reply[2], reply[3]),)
        )
    states = tuple(
        BucketState(policy, reply[1 + 3 * i], reply[2 + 3 * i], reply[3 + 3 * i])
        for i, policy in enumerate(policies)
    )
    return Decision(reply[0] == 1, states)


def shifted(decision: Decision, elapsed: int) -> Decision:
    """Replay a remembered denial with its clocks moved on by `elapsed` µs.

    Tokens left follow from the time until full, as in the script, so a bucket
    that refilled meanwhile is not shown with its old count.
    """
    states = []
    for s in decision.states:
        policy, reset = s.policy, max(0, s.reset_us - elapsed)
        remaining = (policy.burst * policy.interval_us - reset) // policy.interval_us
        retry = max(1, s.retry_us - elapsed) if s.denied else s.retry_us
        states.append(BucketState(policy, remaining, retry, reset))
    return Decision(False, tuple(states))
