"""Worker processes: take jobs off the queue, run them upstream, settle them once."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

from redis.asyncio import Redis
from redis.exceptions import RedisError

from ..clock import Clock, midnight, utc_now
from ..content import Content, Model
from ..metrics import Metrics
from ..moderation.log import ModerationLog, Record, upstream_refusal
from ..moderation.outputs import OutputCheck, OutputRefused
from ..moderation.providers.base import Picture
from ..settings import WorkbenchSettings
from ..square.feed import SquareStore
from ..store.connect import STORE_ERRORS, is_cluster
from ..store.pubsub import Subscriber
from .generations import GenerationStore
from .ledger import account_key, iso, now, text
from .media.fetchable import fetchable_url
from .media.finishing import finish
from .media.pending import Note, PendingMedia
from .media.store import CONTENT_TYPES, MediaStore, new_key
from .positions import Timings
from .queue import CANCEL_CHANNEL, READY_CHANNEL, JobQueue, entry_in
from .upstreams.base import Output, Request, Upstream, UpstreamError
from .upstreams.slots import UpstreamSlots
from .upstreams.tasks import RedisMemo
from .works import WorkStore

_LOGGER: Final = logging.getLogger(__name__)
JANITOR_SECONDS: Final = 1.0
# An idle worker reads the queue again after this long even without a ring.
IDLE_POLL_SECONDS: Final = 0.5
# On a single Redis an idle worker waits on the queue itself, this long at a time.
IDLE_BLOCK_MS: Final = 500
# A worker whose read found the jobs it planned taken by others reads again after this.
RACED_SECONDS: Final = 0.02
# How long SIGTERM waits for running jobs before handing them back.
SHUTDOWN_GRACE_SECONDS: Final = 10.0
PROGRESS_STEP: Final = 0.02
# A job whose progress has not moved still asks this often whether it was
# canceled: the cancel's message may have gone out before this worker listened.
STILL_ASK_SECONDS: Final = 2.0


class JobGone(Exception):
    """The generation was canceled or settled elsewhere: stop working on it."""


class _Stored(NamedTuple):
    """A job's outputs as stored: its works, their files' keys, the keys of the
    sampled frames that are only for the output check, and every file's note."""

    works: list[dict[str, Any]]
    keys: list[str]
    probes: list[str]
    notes: list[Note]


@dataclass
class _Running:
    gid: str
    entry: str
    task: asyncio.Task[None]
    canceled: bool = False
    # Where the job keeps its vendor task (set once the upstream is called).
    memo: RedisMemo | None = None


@dataclass
class Worker:
    """Run up to `concurrency` jobs at once; renew their leases; tidy the queue."""

    redis: Redis
    content: Content
    settings: WorkbenchSettings
    media: MediaStore
    upstream_for: Callable[[Model], Upstream]
    metrics: Metrics = field(default_factory=Metrics.inert)
    # Replicas that must hold a settlement before it counts (redis_wait_replicas).
    wait_replicas: int = 0
    # The most jobs in flight across all workers, per upstream name (None: each
    # [upstreams.NAME] max_in_flight; absent or 0: no limit). A dead worker's
    # slot comes back after jobs.visibility_timeout, as its job does.
    in_flight: Mapping[str, int] | None = None
    # What day it is: a model past its retires_at runs no more jobs.
    clock: Clock = utc_now
    # The app's origin: outputs' URLs a moderation provider fetches are made on it.
    base_url: str = ""
    consumer: str = field(
        default_factory=lambda: (
            f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        )
    )

    def __post_init__(self) -> None:
        self.queue = JobQueue(self.redis)
        self.generations = GenerationStore(self.redis, self.wait_replicas)
        days = self.settings.moderation.log_days
        self.moderation_log = ModerationLog(self.redis, days, self.clock)
        self.output_check = OutputCheck(self.settings.moderation)
        self.pending = PendingMedia(self.redis)
        self.works = WorkStore(self.redis, SquareStore(self.redis))
        self._ready = asyncio.Event()  # READY_CHANNEL rang: a job may be waiting
        self._running: dict[str, _Running] = {}
        self._slots = asyncio.Semaphore(self.settings.worker_concurrency)
        self._last_renewal = 0.0
        self._timings = Timings()
        in_flight = self.in_flight
        if in_flight is None:
            in_flight = {
                name: upstream.max_in_flight
                for name, upstream in self.settings.upstreams.items()
            }
        self._upstream_slots = {
            name: UpstreamSlots(
                self.redis, name, limit, lease=self.settings.visibility_timeout
            )
            for name, limit in in_flight.items()
            if limit > 0
        }

    async def run(self, stop: asyncio.Event) -> None:
        """Work until `stop` is set, then finish or hand back what is running."""
        while not stop.is_set():
            try:  # a worker may start while Redis (or a cluster master) is down
                await self.queue.ensure_group()
                break
            except STORE_ERRORS as err:
                _LOGGER.warning("queue unavailable: %s", type(err).__name__)
                await _sleep_or_stop(stop, 1.0)
        listening = asyncio.Event()
        helpers = [
            asyncio.create_task(self._janitor(stop), name="janitor"),
            asyncio.create_task(self._signals(stop, listening), name="signals"),
        ]
        try:  # a job taken before its cancel channel is heard could miss a cancel
            await _unless_stopped(listening.wait(), stop)
            await self._consume(stop)
        finally:
            await self._shut_down()
            for helper in helpers:
                helper.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)

    async def _consume(self, stop: asyncio.Event) -> None:
        raced = RACED_SECONDS
        while not stop.is_set():
            free = self.settings.worker_concurrency - len(self._running)
            if free <= 0:
                await self._wait_for_a_slot(stop)
                continue
            self._ready.clear()
            try:
                batch = await self.queue.read(self.consumer, free)
                for entry, gid in batch.jobs:
                    self._start(entry, gid)
                if batch.jobs:
                    raced = RACED_SECONDS
                    continue
                if is_cluster(self.redis):  # a cluster cannot block on all shards
                    await self._wait_for_a_job(stop)
                elif batch.waiting:  # others took them first (or a dead worker holds
                    await _sleep_or_stop(stop, raced)  # them until its lease lapses)
                    raced = min(2 * raced, IDLE_POLL_SECONDS)
                else:  # idle: the next submit ends the wait
                    await _unless_stopped(self.queue.wait(IDLE_BLOCK_MS), stop)
            except STORE_ERRORS as err:
                _LOGGER.warning("queue read failed: %s", type(err).__name__)
                await _sleep_or_stop(stop, 1.0)

    async def _wait_for_a_job(self, stop: asyncio.Event) -> None:
        """Sleep until a submit rings READY_CHANNEL (or IDLE_POLL_SECONDS pass)."""
        ready = asyncio.ensure_future(self._ready.wait())
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait(
            {ready, stopper},
            timeout=IDLE_POLL_SECONDS,
            return_when=asyncio.FIRST_COMPLETED,
        )
        ready.cancel()
        stopper.cancel()

    async def _wait_for_a_slot(self, stop: asyncio.Event) -> None:
        tasks = {running.task for running in self._running.values()}
        stopper = asyncio.ensure_future(stop.wait())
        await asyncio.wait({*tasks, stopper}, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()

    def _start(self, entry: str, gid: str) -> None:
        if entry in self._running:
            return
        task = asyncio.create_task(self._run_job(entry, gid), name=f"job-{gid}")
        self._running[entry] = _Running(gid, entry, task)
        task.add_done_callback(lambda _: self._running.pop(entry, None))

    async def _shut_down(self) -> None:
        """Give running jobs a grace period, then hand the rest back at once."""
        if not self._running:
            return
        tasks = [running.task for running in self._running.values()]
        _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_SECONDS)
        left = [r.entry for r in self._running.values() if r.task in pending]
        for running in self._running.values():
            if running.memo is not None:  # the next worker polls its vendor task
                running.memo.handing_back = True
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if left:
            idle_ms = self.settings.visibility_timeout * 1000
            with contextlib.suppress(RedisError, OSError):
                await self.queue.hand_back(self.consumer, left, idle_ms)
            _LOGGER.info("handed back %d running jobs", len(left))

    async def _run_job(self, entry: str, gid: str) -> None:
        """Run one delivery of a job; every outcome is a settled transition."""
        try:
            await self._attempt(entry, gid)
        except asyncio.CancelledError:
            running = self._running.get(entry)
            if running is None or not running.canceled:
                raise  # shutting down: the job goes back, unsettled
            await self.queue.finish(gid, entry)  # canceled by its owner
        except STORE_ERRORS as err:
            # The job stays unacknowledged; its lease lapses and it runs again.
            _LOGGER.warning("job %s interrupted: %s", gid, type(err).__name__)

    async def _attempt(self, entry: str, gid: str) -> None:
        job = await self.queue.take(entry, gid)  # its record; one more run counted
        if not job or "account" not in job:
            await self.queue.finish(gid, entry)
            return
        account = job["account"]
        if await self._retired(account, gid):  # its queued jobs fail, refunded
            await self._fail(account, gid, entry, "MODEL_UNAVAILABLE")
            return
        ack = entry_in(entry, account)  # a job found ended is finished with it
        outcome, fields = await self.generations.settle(account, gid, "start", ack=ack)
        if outcome in ("FINISHED", "NOT_FOUND"):
            if not ack:
                await self.queue.finish(gid, entry)
            return
        remaining = float(job["deadline"]) - time.time()
        started = time.monotonic()
        model = fields.get("model", "?")
        if outcome == "STARTED":  # the estimates' windows (positions.py)
            self._timings.started(time.time())
        try:
            async with asyncio.timeout(max(0.0, remaining)):
                works, keys, probes, notes = await self._produce(
                    account, gid, entry, fields
                )
        except TimeoutError:
            await self._fail(account, gid, entry, "TIMED_OUT", model, started)
            return
        except UpstreamError as err:
            blocked = err.code == "CONTENT_BLOCKED"  # the upstream's own refusal
            record = upstream_refusal(account, fields) if blocked else None
            await self._fail(account, gid, entry, err.code, model, started, record)
            return
        except JobGone:
            await self.queue.finish(gid, entry)
            return
        except STORE_ERRORS:
            raise
        except Exception:
            _LOGGER.exception("job %s failed unexpectedly", gid)
            await self._fail(account, gid, entry, "UPSTREAM_FAILED", model, started)
            return
        shown = [w["thumb_key" if w["kind"] == "video" else "media_key"] for w in works]
        try:  # the moderation provider's look at every output, if one is set
            await self.output_check.check(
                shown + probes, self._picture, float(job["deadline"]),
                account=account, generation=fields,
            )  # fmt: skip
        except OutputRefused as refused:
            await self._discard(keys + probes, notes)
            await self._fail(
                account, gid, entry, refused.code, model, started, refused.record
            )
            return
        except BaseException:  # canceled or stopped while it was asked
            await self._discard(keys + probes, notes)
            raise
        await self._discard(probes)  # checked: a clip's sampled frames go
        ack = entry_in(entry, account)  # settled and finished in one step
        outcome, _ = await self.generations.settle(
            account, gid, "succeed", *_succeed_args(works), ack=ack
        )
        if outcome != "OK":  # canceled or timed out meanwhile: discard the result
            await self._discard(keys)
        await self.pending.settled(notes)  # kept by the works, or deleted
        self._timed(model, "succeeded" if outcome == "OK" else "discarded", started)
        if outcome == "OK":
            self._timings.ran(model, time.monotonic() - started)
        if not ack:
            await self.queue.finish(gid, entry)

    async def _discard(self, keys: list[str], notes: list[Note] | None = None) -> None:
        """Delete stored files; with their notes, take those back too."""
        for key in keys:
            await self.media.delete(key)
        if notes:
            await self.pending.settled(notes)

    async def _picture(self, key: str) -> Picture:
        data = b"".join([chunk async for chunk in self.media.chunks(key)])
        return Picture(data, await fetchable_url(self.media, key, self.base_url))

    async def _retired(self, account: str, gid: str) -> bool:
        """Tell whether the job's model has retired since it was charged.

        Submit refuses a retired model, and a job waits no longer than its
        deadline, so only models retired within the longest deadline (and a day
        to spare) can have jobs waiting: other days cost no read at all.
        """
        now = self.clock()
        longest = max(self.settings.image_deadline, self.settings.video_deadline)
        since = now - dt.timedelta(days=1, seconds=longest)
        recent = {
            model.id
            for model in self.content.models
            if model.retires_at and since <= midnight(model.retires_at) <= now
        }
        if not recent:
            return False
        generation = await self.generations.get(account, gid)
        return generation is not None and generation.get("model") in recent

    def _timed(self, model: str, outcome: str, started: float) -> None:
        self.metrics.job_seconds.labels(model, outcome).observe(
            time.monotonic() - started
        )

    async def _fail(
        self,
        account: str,
        gid: str,
        entry: str,
        code: str,
        model: str = "?",
        started: float | None = None,
        record: Record | None = None,
    ) -> None:
        ack = entry_in(entry, account)  # settled and finished in one step
        outcome, fields = await self.generations.settle(
            account, gid, "fail", code, ack=ack
        )
        if outcome == "OK":
            self.metrics.credits.labels("refunded").inc(int(fields["credits"]))
            if record is not None:  # a refusal for its content: logged once
                await self.moderation_log.append(record)
        if started is not None:
            self._timed(model, "failed", started)
        if not ack:
            await self.queue.finish(gid, entry)

    async def _produce(
        self, account: str, gid: str, entry: str, fields: dict[str, str]
    ) -> _Stored:
        """Ask the upstream (retrying transient faults), then store the media."""
        model = self.content.model(fields["model"])
        if model is None:
            raise UpstreamError("UPSTREAM_FAILED", transient=False)
        width, height = _size(fields["size"])
        deadline = (
            self.settings.video_deadline
            if model.kind == "video"
            else self.settings.image_deadline
        )
        # Kept as long as the job may run (and be re-delivered) at all.
        memo = RedisMemo(
            self.redis, gid, deadline + 2 * self.settings.visibility_timeout
        )
        if running := self._running.get(entry):
            running.memo = memo
        request = Request(
            model=model.id,
            upstream_model=model.upstream_model,
            kind=model.kind,
            prompt=fields["prompt"],
            negative_prompt=fields.get("negative_prompt", ""),
            width=width,
            height=height,
            count=int(fields["count"]),
            seed=int(fields["seed"]),
            seconds=float(model.seconds) if model.seconds else None,
            reference=await self._reference(account, model, fields),
            memo=memo,
            job=gid,
            workflow=self.content.workflows.get(model.workflow or ""),
            inputs=dict(model.inputs),
        )
        shown = float(fields.get("progress", "0"))
        asked = time.monotonic()

        async def progress(fraction: float) -> None:
            nonlocal shown, asked
            moved = fraction >= shown + PROGRESS_STEP
            if not moved and time.monotonic() - asked < STILL_ASK_SECONDS:
                return
            asked = time.monotonic()
            if moved:
                shown = fraction
            # The same value again is IGNORED (no event) unless the job has ended.
            outcome, _ = await self.generations.settle(
                account, gid, "progress", f"{min(shown, 0.99):.3f}"
            )
            if outcome == "FINISHED":
                raise JobGone(gid)

        upstream = self.upstream_for(model)
        slots = self._upstream_slots.get(model.upstream)
        delay = 1.0
        while True:
            try:  # a slot only while calling: none is held through a backoff
                async with slots.held() if slots else contextlib.nullcontext():
                    outputs = await upstream.generate(request, progress)
                break
            except UpstreamError as err:
                self.metrics.upstream_errors.labels(
                    err.code, "yes" if err.transient else "no"
                ).inc()
                if not err.transient:
                    raise
                wait = err.retry_after or delay
                _LOGGER.info("job %s: upstream busy, retrying in %.1fs", gid, wait)
                await asyncio.sleep(wait)  # the job's deadline bounds the retries
                delay = min(delay * 2, 30.0)
        return await self._publishable(account, gid, fields, outputs)

    async def _reference(
        self, account: str, model: Model, fields: Mapping[str, str]
    ) -> bytes | None:
        """Read the reference upload's bytes (the upstream sends them on)."""
        upload = fields.get("reference")
        if not upload or not model.accepts_reference:
            return None
        key = await self.redis.hget(f"{account_key(account)}:upload:{upload}", "key")
        if key is None:  # the upload is gone: nothing to send, nothing to make
            raise UpstreamError("UPSTREAM_FAILED", transient=False)
        return b"".join([chunk async for chunk in self.media.chunks(text(key))])

    async def _publishable(
        self, account: str, gid: str, fields: dict[str, str], outputs: list[Output]
    ) -> _Stored:
        """Store each output with its thumbnail; describe it as a work."""
        loop = asyncio.get_running_loop()
        works, keys, probes = [], [], []
        files: list[tuple[Note, bytes]] = []  # noted all at once, then put
        created = iso(now())
        labeled = []  # every output labeled before any is stored
        finishing = functools.partial(
            finish, self.settings.labels, frames=self.output_check.enabled
        )
        for output in outputs:
            work_id = secrets.token_hex(10)  # the labels' ProduceID and PropagateID
            finished = await loop.run_in_executor(
                None, finishing, output.data, output.extension, work_id
            )
            labeled.append((output, work_id, finished))
        for output, work_id, finished in labeled:
            duration: float | None = None
            if finished.video is not None:
                width, height, duration = finished.video
            else:
                width, height = _size(fields["size"])
            key, thumb_key = new_key(output.extension), new_key("webp")
            files.append((Note(account, gid, work_id, key), finished.data))
            files.append((Note(account, gid, work_id, thumb_key), finished.thumb))
            keys += [key, thumb_key]
            for frame in finished.frames:  # for the output check, then deleted
                probes.append(probe := new_key("webp"))
                files.append((Note(account, gid, "", probe), frame))
            work: dict[str, Any] = {
                "id": work_id,
                "generation_id": gid,
                "kind": fields["kind"],
                "model": fields["model"],
                "prompt": fields["prompt"],
                "media_url": self.media.url(key),
                "thumb_url": self.media.url(thumb_key),
                "width": width,
                "height": height,
            }
            if duration is not None:
                work["duration"] = round(duration, 2)
            work |= {
                "content_type": CONTENT_TYPES[output.extension],
                "created_at": created,
                "published_at": None,
                "favorites": 0,
                "favorite": False,
                "media_key": key,
                "thumb_key": thumb_key,
            }
            works.append(work)
        notes = [note for note, _ in files]
        await self.pending.note(notes)  # written down before any file is put
        for note, data in files:
            await self.media.put(note.key, data)
        return _Stored(works, keys, probes, notes)

    async def _janitor(self, stop: asyncio.Event) -> None:
        """Renew leases, take over silent workers' jobs, end the late ones."""
        while not stop.is_set():
            try:
                await self._tidy()
            except STORE_ERRORS as err:
                _LOGGER.warning("janitor: %s", type(err).__name__)
            except Exception:  # a bug must not end the leases' renewal for good
                _LOGGER.exception("janitor failed; it goes on")
            await _sleep_or_stop(stop, JANITOR_SECONDS)

    async def _tidy(self) -> None:
        await self._timings.flush(self.redis)
        lease = self.settings.visibility_timeout
        if time.monotonic() - self._last_renewal >= lease / 3:
            await self.queue.renew(self.consumer, list(self._running))
            self._last_renewal = time.monotonic()
        free = self.settings.worker_concurrency - len(self._running)
        if free > 0:
            for entry, gid in await self.queue.reclaim(
                self.consumer, lease * 1000, free
            ):
                _LOGGER.info("took over job %s from a silent worker", gid)
                self._start(entry, gid)
        for ref, gid in await self.queue.due(time.time()):
            job = await self.queue.job(ref, gid)
            if account := job.get("account"):
                outcome, fields = await self.generations.settle(
                    account, gid, "fail", "TIMED_OUT"
                )
                if outcome == "OK":
                    self.metrics.credits.labels("refunded").inc(int(fields["credits"]))
            self._stop_local(gid)
            await self.queue.finish(gid, ref)
        await self._sweep_pending()

    async def _sweep_pending(self) -> None:
        """Delete what killed runs stored, once their generations are final.

        Only notes older than a lease are looked at: a run that old has been
        taken over if its worker died.
        """
        lease = self.settings.visibility_timeout
        for note in await self.pending.stale(time.time() - lease):
            fields = await self.generations.get(note.account, note.gid)
            if fields and fields.get("status") in ("queued", "running"):
                await self.pending.later(note)  # a run of it may still keep it
                continue
            if not await self._kept(note):
                _LOGGER.info("deleting %s, left by a run of %s", note.key, note.gid)
                await self.media.delete(note.key)
            await self.pending.settled([note])

    async def _kept(self, note: Note) -> bool:
        """Tell whether the work a file was made for holds it."""
        if not note.work_id:
            return False
        owned = await self.works.owned(note.account, note.work_id)
        return owned is not None and note.key in (
            owned.record.get("media_key"),
            owned.record.get("thumb_key"),
        )

    async def _signals(self, stop: asyncio.Event, listening: asyncio.Event) -> None:
        """Stop a running job the moment its owner cancels it; wake on new jobs."""
        subscriber = Subscriber(self.redis)
        while not stop.is_set():
            try:
                await subscriber.subscribe(CANCEL_CHANNEL, READY_CHANNEL)
                listening.set()
                while not stop.is_set():
                    message = await subscriber.get_message(timeout=1.0)
                    if not message or message["type"] != "message":
                        continue
                    if text(message["channel"]) == READY_CHANNEL:
                        self._ready.set()
                    else:
                        self._stop_local(text(message["data"]))
            except STORE_ERRORS as err:
                _LOGGER.warning("worker channels: %s", type(err).__name__)
                await _sleep_or_stop(stop, 1.0)
            except Exception:  # a bug must not deafen the worker to cancels for good
                _LOGGER.exception("worker channels failed; listening again")
                await _sleep_or_stop(stop, 1.0)
        await subscriber.aclose()

    def _stop_local(self, gid: str) -> None:
        for running in self._running.values():
            if running.gid == gid and not running.canceled and not running.task.done():
                running.canceled = True
                running.task.cancel()


def _size(size: str) -> tuple[int, int]:
    width, _, height = size.partition("x")
    return int(width), int(height)


def _succeed_args(works: list[dict[str, Any]]) -> list[str]:
    """The works for the generation's record, then each work's own record."""
    public = [{k: v for k, v in w.items() if not k.endswith("_key")} for w in works]
    args = [json.dumps(public, ensure_ascii=False)]
    for work in works:
        args += [work["id"], json.dumps(work, ensure_ascii=False)]
    return args


async def _unless_stopped(wait: Awaitable[object], stop: asyncio.Event) -> None:
    """Await `wait`, or cancel it once `stop` is set."""
    waiting = asyncio.ensure_future(wait)
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({waiting, stopper}, return_when=asyncio.FIRST_COMPLETED)
    stopper.cancel()
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting  # its error, if any, is the caller's


async def _sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)
