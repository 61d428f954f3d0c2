"""`studio moderation|accounts|reports`: content safety's commands, from a shell."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

from redis.asyncio import Redis

from ..account.deletion import DeletionStore
from ..settings import Settings, SettingsError
from ..square.feed import SquareStore
from ..studio.media.chosen import opened_media_store
from ..studio.media.faults import MediaUnavailable
from ..studio.media.store import MissingMedia
from ..studio.works import WorkStore
from .log import ModerationLog
from .providers.base import ProviderError
from .reports import AlreadyDecided, ReportNotFound, ReportStore
from .sanctions import Sanctions
from .setup import moderation_for

OK: Final = 0
REFUSED: Final = 1
# `moderation test`: the provider did not answer and the list did not refuse.
UNDECIDED: Final = 3
# Finds an account's id by its address (service/operator.py's, with the keys).
FindAccount = Callable[[str], Awaitable[str | None]]


def _print(line: dict[str, Any]) -> None:
    print(json.dumps(line, ensure_ascii=False))


async def run_moderation(
    args: argparse.Namespace, settings: Settings, redis: Redis, find: FindAccount
) -> int:
    """Carry out a `moderation` or `accounts` command."""
    log = ModerationLog(redis, settings.workbench.moderation.log_days)
    if args.command == "accounts":
        return await _accounts(args, settings, redis, log)
    if args.command == "reports":
        return await _reports(args, settings, redis, log)
    if args.moderation_command == "test":
        return await _test(args.text, settings, log)
    account = None
    if args.account:
        account = await find(args.account)
        if account is None:
            print(f"studio: no account for {args.account}", file=sys.stderr)
            return REFUSED
    async for record in log.read(args.since, account):
        _print(record)
    return OK


def _refuse(message: str) -> int:
    print(f"studio: {message}", file=sys.stderr)
    return REFUSED


async def _deletions(settings: Settings, redis: Redis) -> DeletionStore:
    """The stores a suspension acts through, with the service's own keys."""
    if not settings.secret_key:
        raise SettingsError("STUDIO_SECRET_KEY: required")
    media = await opened_media_store(settings.workbench)
    return DeletionStore.build(redis, settings, media)


async def _reports(
    args: argparse.Namespace, settings: Settings, redis: Redis, log: ModerationLog
) -> int:
    store = ReportStore(redis, log)
    if args.reports_command == "list":
        async for report in store.listed(open_only=args.open):
            _print(report)
        return OK
    deletions = await _deletions(settings, redis)
    sanctions = Sanctions(redis, deletions, log)
    works = WorkStore(redis, SquareStore(redis))
    try:
        done = await store.decide(
            args.report_id, args.decision, args.note, works, sanctions, deletions.media
        )
    except ReportNotFound:
        return _refuse(f"no report {args.report_id}")
    except AlreadyDecided:
        return _refuse(f"report {args.report_id} was decided before")
    except (MissingMedia, MediaUnavailable) as err:
        # Off the square already; the report stays open: resolving it again
        # moves the files once the media store (media.dir, the bucket) has them.
        return _refuse(
            f"report {args.report_id}: the work is off the square, but its files"
            f" could not be moved ({type(err).__name__}: {err}); check the media"
            " settings and resolve it again"
        )
    print(f"{done['id']} decided: {done['decision']} (work {done['work']})")
    return OK


async def _test(text: str, settings: Settings, log: ModerationLog) -> int:
    """Print the list's and the provider's verdicts; exit 1 when refused.

    A provider that does not answer is said in the line ("unknown" unless the
    list refuses anyway) and exits UNDECIDED: 1 keeps meaning "refused".
    """
    moderation = moderation_for(settings, log)
    found = moderation.verdict(text)
    provider: dict[str, Any] | None = None
    blocked = found is not None
    undecided = False
    if moderation.provider is not None:
        try:
            said = await moderation.provider.text(text)
        except ProviderError as err:
            provider, undecided = {"error": str(err)}, True
        else:
            provider = {"blocked": said.blocked, "label": said.label}
            blocked = blocked or said.blocked
    verdict = "blocked" if blocked else "unknown" if undecided else "allowed"
    _print(
        {
            "verdict": verdict,
            "list": found.term if found else None,
            "provider": provider,
        }
    )
    if blocked:
        return REFUSED
    return UNDECIDED if undecided else OK


async def _accounts(
    args: argparse.Namespace, settings: Settings, redis: Redis, log: ModerationLog
) -> int:
    if args.accounts_command == "suspend" and not args.reason.strip():
        return _refuse("--reason: say why (the moderation log keeps it)")
    deletions = await _deletions(settings, redis)
    email = args.email.strip().lower()
    account_id = await deletions.accounts.find(email)
    sanctions = Sanctions(redis, deletions, log)
    if account_id is None:
        # A deleted account's suspension stays with its address: lift it there.
        if args.accounts_command == "restore" and await sanctions.restore_address(
            email
        ):
            print(f"{email} restored (its account was deleted)")
            return OK
        return _refuse(f"no account for {email}")
    if args.accounts_command == "restore":
        if not await sanctions.restore(account_id):
            return _refuse(f"{email} is not suspended")
        print(f"{account_id} restored")
        return OK
    done = await sanctions.suspend(
        account_id, args.reason, args.days, source="operator"
    )
    print(
        f"{account_id} suspended until {done.until or 'restored'}: {done.sessions}"
        f" sessions ended, {done.generations} generations canceled and refunded,"
        f" {done.works} works off the square"
    )
    return OK
