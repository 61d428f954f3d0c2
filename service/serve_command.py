"""The `serve` and `dev` commands: the web app, alone or with embedded servers.

Its own module, imported only when one of them runs, so that a worker or an
operator command never loads the web app.
"""

from __future__ import annotations

import asyncio
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

from .app import create_app, freeze_startup_objects
from .content import Content, content_for
from .labels.notices import notices, require_signing_key
from .loop import new_loop
from .settings import (
    Settings,
    WorkbenchSettings,
    require_production,
    variable,
)
from .store.embedded import MailCatcher, RedisServer
from .supervisor import Supervisor
from .web.access_log import AccessLog
from .web.hardening import (
    LISTEN_BACKLOG,
    answer_own_errors_in_json,
    handler_options,
    hide_server_version,
    raise_open_files_limit,
    setup_log_hygiene,
)

_LOGGER: Final = logging.getLogger("service")


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
    """Make slow or hostile clients cheap: descriptors, clean logs, no versions,
    and aiohttp's own error answers in JSON."""
    raise_open_files_limit()
    setup_log_hygiene()
    hide_server_version()
    answer_own_errors_in_json()


def serve(settings: Settings, *, workers: int = 1, reuse_port: bool = False) -> int:
    """Run the service as production does; never start embedded servers.

    With several workers this process only supervises: each worker is a whole
    `serve` binding the port with SO_REUSEPORT (see service/supervisor.py).
    """
    require_production(settings)
    content = content_for(settings)  # a fault stops the supervisor, not N workers
    require_signing_key(settings.workbench.labels)
    if not reuse_port:  # said once: by the supervisor of `serve --workers N`
        for notice in notices(settings.workbench.labels):
            _LOGGER.warning("%s", notice)
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
            loop=new_loop(),
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
            workbench=_dev_workbench(settings, secret),
        )
        require_signing_key(dev_settings.workbench.labels)
        for notice in notices(dev_settings.workbench.labels):
            _LOGGER.warning("%s", notice)
        loop = new_loop()
        try:
            loop.run_until_complete(_run_until_signal(dev_settings, content))
        finally:
            loop.close()


def _dev_workbench(settings: Settings, secret: str) -> WorkbenchSettings:
    """Label with the dev secret; sign with a local CA's certificate unless set."""
    from .labels.local_ca import local_signing_files  # cryptography: dev only

    labels = dataclasses.replace(settings.workbench.labels, secret_key=secret)
    if labels.c2pa_cert is None:
        cert, key = local_signing_files(settings.data_dir)
        labels = dataclasses.replace(labels, c2pa_cert=cert, c2pa_key=key)
        _LOGGER.info("C2PA: signing with the local CA's certificate in %s", cert)
    return dataclasses.replace(settings.workbench, labels=labels)
