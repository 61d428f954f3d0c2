"""Operator commands: act on works and credits from a shell, with one-line answers."""

from __future__ import annotations

import argparse
import functools
import sys
from typing import Final

from redis.asyncio import Redis
from redis.exceptions import RedisError

from .account.operator import run_account
from .auth.accounts import AccountStore
from .auth.identity import Keyring
from .auth.sessions import SessionStore
from .moderation.log import ModerationLog, Record
from .moderation.operator import run_moderation
from .payments.operator import run_payments
from .settings import Settings, SettingsError, variable
from .square.feed import SquareStore
from .store.connect import connect
from .store.durable import WAIT_MS, ReplicasBehind
from .studio.ledger import MAX_ADJUST, InsufficientCredits, Ledger, UnknownAccount
from .studio.media.chosen import opened_media_store
from .studio.media.faults import MediaUnavailable
from .studio.media.pending import PendingMedia
from .studio.media.store import MissingMedia
from .studio.takedown import withdraw_files
from .studio.works import WorkNotFound, WorkStore

OK: Final = 0
REFUSED: Final = 1


async def run(args: argparse.Namespace, settings: Settings) -> int:
    """Carry out an operator command; print the result or one line of refusal."""
    if not settings.redis_url:
        raise SettingsError("STUDIO_REDIS_URL: required")
    redis = connect(
        settings.redis_url,
        cluster=settings.redis_cluster,
        connect_timeout=5.0,
        socket_timeout=5.0,
        retries=3,
    )
    try:
        if args.command == "works":
            done = await _works(redis, settings, args.action, args.work_id)
            if done == OK:  # an operator's decision on content: in the log
                days = settings.workbench.moderation.log_days
                await ModerationLog(redis, days).append(
                    Record(source="operator", verdict=args.action, work=args.work_id)
                )
            return done
        if args.command == "sessions":
            return await _revoke(redis, settings, args.email)
        if args.command == "keys":
            return await _refile(redis, settings)
        if args.command == "payments":
            return await run_payments(args, settings, redis)
        if args.command == "account":
            return await run_account(args, settings, redis)
        if args.command in ("moderation", "accounts", "reports"):
            find = functools.partial(_account_id, redis, settings)
            return await run_moderation(args, settings, redis, find)
        return await _grant(redis, settings, args.email, args.amount, args.note)
    except ReplicasBehind as err:
        # Written on the master: running it again could do it twice.
        print(
            f"studio: done on the master but confirmed by {err} within"
            f" {WAIT_MS} ms ({variable('redis_wait_replicas')}): check before"
            " running it again",
            file=sys.stderr,
        )
        return REFUSED
    except RedisError as err:
        print(f"studio: Redis unavailable: {type(err).__name__}", file=sys.stderr)
        return REFUSED
    finally:
        await redis.aclose()


_WHERE: Final = {
    "unpublish": "in the square",
    "remove": "in the square or hidden by reports",
    "restore": "hidden by reports",
}
_DONE: Final = {"unpublish": "unpublished", "remove": "removed", "restore": "restored"}


async def _works(redis: Redis, settings: Settings, action: str, work_id: str) -> int:
    works = WorkStore(redis, SquareStore(redis))
    if action == "remove":
        try:
            done = await _remove(redis, settings, works, work_id)
        except (MissingMedia, MediaUnavailable) as err:
            print(
                f"studio: {work_id}: its files could not be moved"
                f" ({type(err).__name__}: {err}), so it was not removed; check"
                " the media settings and run it again (`studio works unpublish`"
                " takes it off the square meanwhile)",
                file=sys.stderr,
            )
            return REFUSED
    elif action == "unpublish":
        done = await works.take_down(work_id)
    else:
        done = await works.restore(work_id)
    if not done:
        print(f"studio: no work {work_id} {_WHERE[action]}", file=sys.stderr)
        return REFUSED
    print(f"{work_id} {_DONE[action]}")
    return OK


async def _remove(
    redis: Redis, settings: Settings, works: WorkStore, work_id: str
) -> bool:
    """Remove a work found unlawful without a report: as a report's `remove`
    does, off the square for good and its URLs dead (studio/takedown.py).

    Its files move first: while they cannot, the work stays where it is and
    can still be found by its id, so the command can be run again.
    """
    author = await works.author_of(work_id)
    if author is None:
        return False
    media = await opened_media_store(settings.workbench)
    if not await withdraw_files(works, media, PendingMedia(redis), author, work_id):
        return False  # deleted by its author meanwhile
    try:
        await works.remove(author, work_id)
    except WorkNotFound:
        return False
    return True


def _accounts(redis: Redis, settings: Settings) -> AccountStore:
    """Reach accounts by address: the keys must be those the service runs with."""
    if not settings.secret_key:
        raise SettingsError("STUDIO_SECRET_KEY: required")
    ledger = Ledger(
        redis,
        trial_credits=settings.trial_credits,
        expire_months=settings.workbench.expire_months,
    )
    keyring = Keyring(settings.secret_key, settings.secret_key_previous)
    return AccountStore(redis, ledger, keyring)


async def _account_id(redis: Redis, settings: Settings, email: str) -> str | None:
    return await _accounts(redis, settings).find(email.strip().lower())


async def _refile(redis: Redis, settings: Settings) -> int:
    filed, kept, clashes = await _accounts(redis, settings).refile_all()
    print(f"{filed} filed, {kept} already filed, {clashes} clashes")
    return OK


async def _revoke(redis: Redis, settings: Settings, email: str) -> int:
    account_id = await _account_id(redis, settings, email)
    if account_id is None:
        print(f"studio: no account for {email}", file=sys.stderr)
        return REFUSED
    ended = await SessionStore(redis).end_all(account_id)
    print(f"{ended} sessions ended")
    return OK


async def _grant(
    redis: Redis, settings: Settings, email: str, amount: int, note: str
) -> int:
    if not 0 < abs(amount) <= MAX_ADJUST:
        print(
            f"studio: the amount must be 1 to {MAX_ADJUST:,} credits, either way",
            file=sys.stderr,
        )
        return REFUSED
    ledger = Ledger(
        redis,
        trial_credits=settings.trial_credits,
        expire_months=settings.workbench.expire_months,
        wait_replicas=settings.redis_wait_replicas,
    )
    account_id = await _account_id(redis, settings, email)
    try:
        if account_id is None:
            raise UnknownAccount(email)
        balance = await ledger.adjust(account_id, amount, note)
    except UnknownAccount:
        print(f"studio: no account for {email}", file=sys.stderr)
        return REFUSED
    except InsufficientCredits as err:
        print(f"studio: refused: the balance is {err.balance}", file=sys.stderr)
        return REFUSED
    print(balance)
    return OK
