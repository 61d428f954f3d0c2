"""`studio moderation|accounts|reports`: content safety's commands, from a shell."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

from redis.asyncio import Redis

from ..account.deletion import DeletionStore
from ..settings import Settings, SettingsError
from ..square.feed import SquareStore
from ..studio.media.chosen import opened_media_store
from ..studio.works import WorkStore
from .log import ModerationLog
from .providers.base import ProviderError
from .reports import AlreadyDecided, ReportNotFound, ReportStore
from .sanctions import Sanctions
from .setup import moderation_for

OK: Final = 0
REFUSED: Final = 1
# Finds an account's id by its address (service/operator.py's, with the keys).
FindAccount = Callable[[str], Awaitable[str | None]]


def _date(text: str) -> dt.date:
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be a date, YYYY-MM-DD") from None


def _days(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 36500:
        raise argparse.ArgumentTypeError("must be a whole number of days, 1-36500")
    return int(text)


def add_moderation_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Declare `moderation log|test`, `accounts suspend|restore`, `reports`."""
    moderation = commands.add_parser("moderation", help="the moderation log and list")
    actions = moderation.add_subparsers(dest="moderation_command", required=True)
    log = actions.add_parser("log", help="print the log's records as JSON lines")
    log.add_argument("--since", type=_date, help="from this UTC day (YYYY-MM-DD)")
    log.add_argument("--account", help="only the records of this address")
    test = actions.add_parser("test", help="the verdict on a text; exit 1 if refused")
    test.add_argument("text")
    accounts = commands.add_parser("accounts", help="suspend or restore an account")
    sanction = accounts.add_subparsers(dest="accounts_command", required=True)
    suspend = sanction.add_parser(
        "suspend", help="end its sessions, jobs and square presence; refuse sign-in"
    )
    suspend.add_argument("email")
    suspend.add_argument("--reason", required=True, help="why (kept in the log)")
    suspend.add_argument("--days", type=_days, help="lapses after N days")
    sanction.add_parser("restore", help="lift a suspension").add_argument("email")
    reports = commands.add_parser("reports", help="the queue of complaints")
    queue = reports.add_subparsers(dest="reports_command", required=True)
    listing = queue.add_parser("list", help="print reports as JSON lines, oldest first")
    listing.add_argument("--open", action="store_true", help="only undecided ones")
    resolve = queue.add_parser("resolve", help="decide a report")
    resolve.add_argument("report_id")
    resolve.add_argument("decision", choices=("keep", "remove", "suspend"))
    resolve.add_argument("--note", default="", help="why (kept in the log)")


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
        moderation = moderation_for(settings, log)
        found = moderation.verdict(args.text)
        try:
            said = (
                await moderation.provider.text(args.text)
                if moderation.provider
                else None
            )
        except ProviderError as err:
            return _refuse(f"the provider did not answer: {err}")
        blocked = found is not None or (said is not None and said.blocked)
        _print(
            {
                "verdict": "blocked" if blocked else "allowed",
                "list": found.term if found else None,
                "provider": None
                if said is None
                else {"blocked": said.blocked, "label": said.label},
            }
        )
        return REFUSED if blocked else OK
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
    sanctions = Sanctions(redis, await _deletions(settings, redis), log)
    works = WorkStore(redis, SquareStore(redis))
    try:
        done = await store.decide(
            args.report_id, args.decision, args.note, works, sanctions
        )
    except ReportNotFound:
        return _refuse(f"no report {args.report_id}")
    except AlreadyDecided:
        return _refuse(f"report {args.report_id} was decided before")
    print(f"{done['id']} decided: {done['decision']} (work {done['work']})")
    return OK


async def _accounts(
    args: argparse.Namespace, settings: Settings, redis: Redis, log: ModerationLog
) -> int:
    deletions = await _deletions(settings, redis)
    email = args.email.strip().lower()
    account_id = await deletions.accounts.find(email)
    if account_id is None:
        return _refuse(f"no account for {email}")
    sanctions = Sanctions(redis, deletions, log)
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
