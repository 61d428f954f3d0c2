"""Command line: `serve` for production, `dev` for `make run` with embedded servers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import secrets
import signal
import sys
from pathlib import Path
from typing import Final

from aiohttp import web
from redis.asyncio import Redis

from . import operator
from .app import create_app, freeze_startup_objects
from .content import load_content
from .settings import Settings, SettingsError, load_settings, require_production
from .store.embedded import MailCatcher, RedisServer
from .studio.media.store import DirectoryStore
from .studio.upstreams.registry import Upstreams
from .studio.worker import Worker

_LOGGER: Final = logging.getLogger("service")


def _new_loop() -> asyncio.AbstractEventLoop:
    """Use uvloop where it is installed: it serves more requests per core."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def serve(settings: Settings) -> None:
    """Run the service alone, as production does; never start embedded servers."""
    require_production(settings)
    if settings.workbench.demo_upstream:
        _LOGGER.warning("STUDIO_DEMO_UPSTREAM is on: every model runs on the demo")
    app = create_app(settings)
    app.on_startup.append(freeze_startup_objects)
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        loop=_new_loop(),
        shutdown_timeout=10,
        print=lambda message: _LOGGER.info("%s", message),
    )


def _dev_secret(data_dir: Path) -> str:
    path = data_dir / "secret_key"
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(48))
    return path.read_text().strip()


async def _until_signal() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()


async def _work(settings: Settings) -> None:
    redis = Redis.from_url(
        settings.redis_url, socket_connect_timeout=1.0, socket_timeout=5.0
    )
    content = load_content()
    upstreams = Upstreams(settings.workbench)
    workbench = settings.workbench
    worker = Worker(
        redis=redis,
        content=content,
        settings=workbench,
        media=DirectoryStore(workbench.media_dir, workbench.media_public_url),
        upstream_for=upstreams,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    _LOGGER.info(
        "worker %s: %d jobs at once", worker.consumer, workbench.worker_concurrency
    )
    try:
        await worker.run(stop)
    finally:
        await upstreams.aclose()
        await redis.aclose()
        _LOGGER.info("worker %s stopped", worker.consumer)


def work(settings: Settings) -> None:
    """Run a worker process: jobs off the queue until SIGTERM, then hand back."""
    if not settings.redis_url:
        raise SettingsError("STUDIO_REDIS_URL: required by worker")
    if settings.workbench.demo_upstream:
        _LOGGER.warning("STUDIO_DEMO_UPSTREAM is on: every model runs on the demo")
    loop = _new_loop()
    try:
        loop.run_until_complete(_work(settings))
    finally:
        loop.close()


async def _run_until_signal(settings: Settings) -> None:
    app = create_app(settings, embedded_worker=True)
    app.on_startup.append(freeze_startup_objects)
    runner = web.AppRunner(app, shutdown_timeout=5)
    await runner.setup()
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
        _LOGGER.info("serving on %s (Ctrl-C stops everything)", settings.base_url)
        await _until_signal()
    finally:
        await runner.cleanup()


def dev(settings: Settings) -> None:
    """Start an embedded Redis (AOF in .data/), an SMTP catcher and the service."""
    secret = settings.secret_key or _dev_secret(settings.data_dir)
    smtp = settings.smtp
    with (
        RedisServer(data_dir=settings.data_dir / "redis", quiet=False) as redis,
        MailCatcher(smtp.host, smtp.port, echo=True),
    ):
        _LOGGER.info("embedded Redis on %s, data in %s", redis.url, redis.data_dir)
        _LOGGER.info(
            "SMTP catcher on %s:%d: sign-in codes appear here", smtp.host, smtp.port
        )
        dev_settings = dataclasses.replace(
            settings,
            redis_url=redis.url,
            secret_key=secret,
            smtp=dataclasses.replace(smtp, tls="off", username="", password=""),
        )
        loop = _new_loop()
        try:
            loop.run_until_complete(_run_until_signal(dev_settings))
        finally:
            loop.close()


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; a bad setting exits 2 with one line."""
    parser = argparse.ArgumentParser(prog="studio", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("serve", help="run the service (production)")
    commands.add_parser(
        "dev", help="run with embedded Redis and SMTP catcher (make run)"
    )
    commands.add_parser("worker", help="run a worker: generation jobs off the queue")
    operator.add_commands(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = load_settings()
        if args.command == "serve":
            serve(settings)
        elif args.command == "worker":
            work(settings)
        elif args.command in ("works", "credits"):
            return asyncio.run(operator.run(args, settings))
        else:
            dev(settings)
    except SettingsError as err:
        print(f"studio: configuration error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"studio: cannot start: {err}", file=sys.stderr)
        return 1
    with contextlib.suppress(Exception):
        logging.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
