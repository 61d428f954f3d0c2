"""`studio moderation log|test`: the log and the list's verdict, from a shell."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any, Final

from redis.asyncio import Redis

from ..settings import Settings
from .log import ModerationLog
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


def add_moderation_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Declare `moderation log [--since DATE] [--account EMAIL]` and `test TEXT`."""
    moderation = commands.add_parser("moderation", help="the moderation log and list")
    actions = moderation.add_subparsers(dest="moderation_command", required=True)
    log = actions.add_parser("log", help="print the log's records as JSON lines")
    log.add_argument("--since", type=_date, help="from this UTC day (YYYY-MM-DD)")
    log.add_argument("--account", help="only the records of this address")
    test = actions.add_parser("test", help="the verdict on a text; exit 1 if refused")
    test.add_argument("text")


def _print(line: dict[str, Any]) -> None:
    print(json.dumps(line, ensure_ascii=False))


async def run_moderation(
    args: argparse.Namespace, settings: Settings, redis: Redis, find: FindAccount
) -> int:
    """Carry out a `moderation` command."""
    log = ModerationLog(redis, settings.workbench.moderation.log_days)
    if args.moderation_command == "test":
        found = moderation_for(settings, log).verdict(args.text)
        _print(
            {
                "verdict": "blocked" if found else "allowed",
                "list": found.term if found else None,
                "provider": None,
            }
        )
        return REFUSED if found else OK
    account = None
    if args.account:
        account = await find(args.account)
        if account is None:
            print(f"studio: no account for {args.account}", file=sys.stderr)
            return REFUSED
    async for record in log.read(args.since, account):
        _print(record)
    return OK
