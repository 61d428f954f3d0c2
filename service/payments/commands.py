"""The `payments` command's arguments, apart from running it: `--help` and the
other commands' start-up never load the providers and the order store."""

from __future__ import annotations

import argparse


def add_payments_command(
    commands: argparse._SubParsersAction[argparse.ArgumentParser],
) -> None:
    """Declare `payments show|query|refund ORDER` and `payments reconcile`."""
    payments = commands.add_parser("payments", help="orders, refunds, reconciling")
    actions = payments.add_subparsers(dest="payments_command", required=True)
    for name, words in (
        ("show", "the order, its refund, its lot and its latest notices"),
        ("query", "ask the provider about the order; credit it if paid"),
        ("refund", "refund the order by the refund policy (safe to run again)"),
    ):
        actions.add_parser(name, help=words).add_argument("order_id")
    actions.add_parser("reconcile", help="one reconciler pass now")
