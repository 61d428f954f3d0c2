"""Command line: `serve` for production, `dev` for `make run` with embedded servers.

Each command imports what it runs when it runs: a worker never loads the web
app, `serve` never loads the worker's encoders, and `--help` loads neither.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from typing import Final

from .commands import OPERATOR_COMMANDS, add_commands
from .labels.command import add_labels_command
from .loop import new_loop
from .settings import SettingsError, load_settings

_LOGGER: Final = logging.getLogger("service")
# `--help`'s description: not __doc__, which the image's PYTHONOPTIMIZE=2 drops.
DESCRIPTION: Final = (
    "Command line: `serve` for production, `dev` for `make run` with embedded servers."
)


def _positive(text: str) -> int:
    """Parse a count of processes: a whole number from 1 to 256."""
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError("must be an integer 1-256")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; a bad setting exits 2 with one line."""
    parser = argparse.ArgumentParser(prog="studio", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_parser = commands.add_parser("serve", help="run the service (production)")
    serve_parser.add_argument(
        "--workers",
        type=_positive,
        default=1,
        help="processes sharing the port (SO_REUSEPORT), supervised; default 1",
    )
    # How the supervisor starts each worker: bind the port with SO_REUSEPORT.
    serve_parser.add_argument(
        "--reuse-port", action="store_true", help=argparse.SUPPRESS
    )
    commands.add_parser(
        "dev", help="run with embedded Redis and SMTP catcher (make run)"
    )
    commands.add_parser("worker", help="run a worker: generation jobs off the queue")
    add_commands(commands)
    add_labels_command(commands)
    args = parser.parse_args(argv)
    # The servers log what they do; an operator command answers on stdout, and
    # its stderr carries only what went wrong.
    running = args.command in ("serve", "worker", "dev")
    logging.basicConfig(
        level=logging.INFO if running else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        settings = load_settings()
        if args.command == "serve":
            from .serve_command import serve

            return serve(settings, workers=args.workers, reuse_port=args.reuse_port)
        elif args.command == "worker":
            from .worker_command import work  # the media encoders, the vendors

            work(settings, new_loop())
        elif args.command == "labels":
            from .labels.check import run_labels  # the labels' readers: c2pa, PyAV

            return run_labels(args, settings)
        elif args.command in OPERATOR_COMMANDS:
            from . import operator  # the stores

            return asyncio.run(operator.run(args, settings))
        else:
            from .serve_command import dev

            dev(settings)
    except SettingsError as err:
        print(f"studio: configuration error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `| head` stopped reading: nothing to say about it
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as err:
        started = args.command in ("serve", "worker", "dev")
        print(
            f"studio: {'cannot start' if started else 'failed'}: {err}", file=sys.stderr
        )
        return 1
    with contextlib.suppress(Exception):
        logging.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
