"""The operator commands' arguments, declared without loading what runs them.

`python -m service worker` (or `serve`) parses its command line with every
command declared; only `service/operator.py`, imported when an operator command
runs, loads the stores.
"""

from __future__ import annotations

import argparse

from .account.commands import add_account_command
from .moderation.commands import add_moderation_commands
from .payments.commands import add_payments_command

OPERATOR_COMMANDS = (
    "works", "credits", "sessions", "keys", "payments", "account",
    "moderation", "accounts", "reports",
)  # fmt: skip


def add_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Declare `works`, `credits`, `sessions`, `payments`, `account`, `keys`, ..."""
    works = commands.add_parser(
        "works", help="take a work off the square, remove it, or restore it"
    )
    works.add_argument("action", choices=("unpublish", "remove", "restore"))
    works.add_argument("work_id")
    credits = commands.add_parser("credits", help="grant or take back credits")
    grant = credits.add_subparsers(dest="credits_command", required=True)
    grant_parser = grant.add_parser("grant", help="N > 0 grants a bonus lot")
    grant_parser.add_argument("email")
    grant_parser.add_argument("amount", type=int)
    grant_parser.add_argument("--note", default="")
    sessions = commands.add_parser("sessions", help="end a person's sessions")
    revoke = sessions.add_subparsers(dest="sessions_command", required=True)
    revoke.add_parser("revoke", help="sign an account out everywhere").add_argument(
        "email"
    )
    add_payments_command(commands)
    add_account_command(commands)
    add_moderation_commands(commands)
    keys = commands.add_parser("keys", help="after a STUDIO_SECRET_KEY rotation")
    keys.add_subparsers(dest="keys_command", required=True).add_parser(
        "refile", help="file every account's address under the current key"
    )
