"""The moderation commands' arguments, apart from running them: `--help` and the
other commands' start-up never load the log, the reports or the providers."""

from __future__ import annotations

import argparse
import datetime as dt


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
