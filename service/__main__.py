"""Command line: `serve` for production, `dev` for `make run` with embedded servers."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import secrets
import signal
import sys
from pathlib import Path
from typing import Any, Final

from aiohttp import web

from . import operator
from .account.deletion import DeletionStore
from .account.exports import ExportJobs
from .account.purger import Purger
from .app import create_app, freeze_startup_objects
from .content import Content, content_for
from .metrics import serve_metrics
from .payments.context import opened as payments_opened
from .payments.reconciler import Reconciler
from .settings import (
    Settings,
    SettingsError,
    load_settings,
    refuse_fake_payments,
    require_production,
    variable,
)
from .store.connect import connect
from .store.embedded import MailCatcher, RedisServer
from .studio.media.chosen import opened_media_store
from .studio.upstreams.registry import Upstreams
from .studio.worker import Worker
from .supervisor import Supervisor
from .web.access_log import AccessLog
from .web.hardening import (
    LISTEN_BACKLOG,
    handler_options,
    hide_server_version,
    raise_open_files_limit,
    setup_log_hygiene,
)

_LOGGER: Final = logging.getLogger("service")


def _new_loop() -> asyncio.AbstractEventLoop:
    """Use uvloop where it is installed: it serves more requests per core."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _access_log(settings: Settings) -> AccessLog | None:
    """Return the process's access log on stdout, or None when it is off."""
    if not settings.access_log:
        return None
    return AccessLog(trusted_proxies=settings.trusted_proxies)


def _access_options(log: AccessLog | None) -> dict[str, Any]:
    """Return the run_app / AppRunner arguments for the access log (or for none)."""
    return log.runner_options() if log else {"access_log": None}


def _worker_environ(settings: Settings, index: int) -> dict[str, str]:
    """Give worker `index` of `serve --workers N` its own metrics port: port + index."""
    environ = dict(os.environ)
    if settings.metrics_port:
        environ[variable("metrics.port")] = str(settings.metrics_port + index)
    return environ


def _harden() -> None:
    """Make slow or hostile clients cheap: descriptors, clean logs, no versions."""
    raise_open_files_limit()
    setup_log_hygiene()
    hide_server_version()


def serve(settings: Settings, *, workers: int = 1, reuse_port: bool = False) -> int:
    """Run the service as production does; never start embedded servers.

    With several workers this process only supervises: each worker is a whole
    `serve` binding the port with SO_REUSEPORT (see service/supervisor.py).
    """
    require_production(settings)
    content = content_for(settings)  # a fault stops the supervisor, not N workers
    if workers > 1:
        command = [sys.executable, "-m", "service", "serve", "--reuse-port"]
        environ = functools.partial(_worker_environ, settings)
        return Supervisor(command, workers, environ=environ).run()
    _harden()
    if settings.workbench.demo_upstream:
        _LOGGER.warning("STUDIO_DEMO_UPSTREAM is on: every model runs on the demo")
    if settings.payments.fake:
        _LOGGER.warning("STUDIO_PAYMENTS_FAKE is on: a fake provider takes payments")
    app = create_app(settings, content=content)
    app.on_startup.append(freeze_startup_objects)
    access_log = _access_log(settings)
    try:
        web.run_app(
            app,
            host=settings.host,
            port=settings.port,
            loop=_new_loop(),
            shutdown_timeout=10,
            print=lambda message: _LOGGER.info("%s", message),
            reuse_port=reuse_port or None,
            backlog=LISTEN_BACKLOG,
            **handler_options(),
            **_access_options(access_log),
        )
    finally:
        if access_log:
            access_log.close()
    return 0


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


async def _work(settings: Settings, content: Content) -> None:
    media = await opened_media_store(settings.workbench)  # first: it may refuse
    redis = connect(
        settings.redis_url,
        cluster=settings.redis_cluster,
        connect_timeout=1.0,
        socket_timeout=5.0,
        retries=3,
    )
    upstreams = Upstreams(settings.workbench)
    workbench = settings.workbench
    worker = Worker(
        redis=redis,
        content=content,
        settings=workbench,
        media=media,
        upstream_for=upstreams,
        wait_replicas=settings.redis_wait_replicas,
        base_url=settings.base_url,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    _LOGGER.info(
        "worker %s: %d jobs at once", worker.consumer, workbench.worker_concurrency
    )
    try:
        async with contextlib.AsyncExitStack() as exposed:
            if settings.metrics_port:
                await exposed.enter_async_context(
                    contextlib.asynccontextmanager(serve_metrics)(
                        worker.metrics, settings.metrics_host, settings.metrics_port
                    )
                )
            # Every worker also follows orders whose payment notice never came.
            providers, orders, _ = await exposed.enter_async_context(
                payments_opened(settings, redis)
            )
            reconciler = Reconciler(
                orders,
                providers,
                every=settings.payments.reconcile_seconds,
                after=settings.payments.reconcile_after,
            )
            reconciling = asyncio.create_task(reconciler.run(stop), name="reconciler")
            # ... and builds the exports people ask for ("export my data").
            exports = ExportJobs(
                redis,
                media,
                lease_seconds=workbench.visibility_timeout,
                privacy_url=f"{settings.base_url}/privacy",
            )
            exporting = asyncio.create_task(exports.run(stop), name="exports")
            # ... and purges the accounts whose grace period is over.
            purger = Purger(
                DeletionStore.build(redis, settings, media),
                every=settings.account.purge_seconds,
            )
            purging = asyncio.create_task(purger.run(stop), name="purger")
            try:
                await worker.run(stop)
            finally:
                stop.set()
                await reconciling
                await exporting
                await purging
    finally:
        await upstreams.aclose()
        await redis.aclose()
        _LOGGER.info("worker %s stopped", worker.consumer)


def work(settings: Settings) -> None:
    """Run a worker process: jobs off the queue until SIGTERM, then hand back."""
    if not settings.redis_url:
        raise SettingsError("STUDIO_REDIS_URL: required by worker")
    refuse_fake_payments(settings)
    content = content_for(settings)
    if settings.workbench.demo_upstream:
        _LOGGER.warning("STUDIO_DEMO_UPSTREAM is on: every model runs on the demo")
    loop = _new_loop()
    try:
        loop.run_until_complete(_work(settings, content))
    finally:
        loop.close()


async def _run_until_signal(settings: Settings, content: Content) -> None:
    _harden()
    app = create_app(settings, content=content, embedded_worker=True)
    app.on_startup.append(freeze_startup_objects)
    access_log = _access_log(settings)
    runner = web.AppRunner(
        app, shutdown_timeout=5, **handler_options(), **_access_options(access_log)
    )
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port, backlog=LISTEN_BACKLOG)
        await site.start()
        _LOGGER.info("serving on %s (Ctrl-C stops everything)", settings.base_url)
        await _until_signal()
    finally:
        await runner.cleanup()
        if access_log:
            access_log.close()


def dev(settings: Settings) -> None:
    """Start an embedded Redis (AOF in .data/), an SMTP catcher and the service."""
    content = content_for(settings)  # before any server starts
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
            loop.run_until_complete(_run_until_signal(dev_settings, content))
        finally:
            loop.close()


def _positive(text: str) -> int:
    """Parse a count of processes: a whole number from 1 to 256."""
    if not text.isdigit() or not 1 <= int(text) <= 256:
        raise argparse.ArgumentTypeError("must be an integer 1-256")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    """Parse the command and run it; a bad setting exits 2 with one line."""
    parser = argparse.ArgumentParser(prog="studio", description=__doc__)
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
    operator.add_commands(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        settings = load_settings()
        if args.command == "serve":
            return serve(settings, workers=args.workers, reuse_port=args.reuse_port)
        elif args.command == "worker":
            work(settings)
        elif args.command in (
            "works", "credits", "sessions", "keys", "payments", "account",
            "moderation", "accounts", "reports",
        ):  # fmt: skip
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
