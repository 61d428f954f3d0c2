"""The `account` command's arguments, apart from running it: `--help` and the
other commands' start-up never load what exporting and deleting need."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_account_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Declare `account export EMAIL --out FILE`, `delete [--now]`, `restore`."""
    account = commands.add_parser("account", help="a person's data and account")
    actions = account.add_subparsers(dest="account_command", required=True)
    export = actions.add_parser("export", help="write the account's ZIP (CONTRACT §9)")
    export.add_argument("email")
    export.add_argument("--out", required=True, type=Path, help="the ZIP to write")
    delete = actions.add_parser(
        "delete", help="delete now; purged after the grace period"
    )
    delete.add_argument("email")
    delete.add_argument("--now", action="store_true", help="purge at once")
    actions.add_parser(
        "restore", help="undo a deletion whose purge has not begun"
    ).add_argument("email")
