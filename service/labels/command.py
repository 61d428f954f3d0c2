"""The `labels` command's arguments, declared without loading the labels' readers."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_labels_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Declare `labels check FILE`."""
    labels = commands.add_parser("labels", help="AI labels on files (CONTRACT §10)")
    actions = labels.add_subparsers(dest="labels_command", required=True)
    actions.add_parser(
        "check", help="print a file's labels; exit 0 only if its TC260 label verifies"
    ).add_argument("file", type=Path)
