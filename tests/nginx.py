"""Run Debian's real nginx with deploy/nginx.conf in front of an upstream."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from service.settings import ROOT

from .ports import free_port

NGINX = shutil.which("nginx") or next(
    (
        path
        for path in ("/usr/sbin/nginx", "/usr/local/sbin/nginx")
        if Path(path).exists()
    ),
    None,
)
CONFIG = ROOT / "deploy" / "nginx.conf"
CACHE_DIR = "/var/cache/nginx/documents"


@dataclass(frozen=True)
class Proxy:
    """A running nginx: its port, master pid and error log."""

    port: int
    pid: int
    log: Path
    directory: Path


def proxy_config(
    directory: Path, port: int, upstream: str, servers: str = "", locations: str = ""
) -> Path:
    """Write deploy/nginx.conf with test ports and a private prefix for temp files.

    `servers` is added inside `http`, `locations` inside the proxy's `server`.
    """
    text = CONFIG.read_text()
    for marker, line in (
        ("server app:8080;  # test: upstream", f"server {upstream};"),
        ("listen 8080;  # test: listen", f"listen 127.0.0.1:{port};"),
        ("/var/log/nginx/access.log", str(directory / "access.log")),
        (CACHE_DIR, str(directory / "cache")),
    ):
        assert text.count(marker) == 1, f"deploy/nginx.conf lost {marker!r}"
        text = text.replace(marker, line)
    temp = "".join(
        f"    {kind}_temp_path {directory / kind};\n"
        for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    assert text.count("http {\n") == 1
    text = text.replace("http {\n", "http {\n" + temp + servers)
    listen = f"listen 127.0.0.1:{port};\n"
    text = text.replace(listen, listen + locations)
    path = directory / "nginx.conf"
    path.write_text(text)
    return path


def _wait_for_port(port: int, process: subprocess.Popen[bytes], log: Path) -> None:
    """Wait until nginx listens (it does once its configuration is loaded)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"nginx exited:\n{log.read_text()}")
        with (
            contextlib.suppress(OSError),
            socket.create_connection(("127.0.0.1", port), timeout=1),
        ):
            return
        time.sleep(0.05)
    raise AssertionError(f"nginx did not listen:\n{log.read_text()}")


@contextlib.contextmanager
def nginx_in_front(
    upstream: str,
    servers: str = "",
    locations: str = "",
    prefix: Sequence[str] = (),
) -> Iterator[Proxy]:
    """Start nginx with deploy/nginx.conf before `upstream` (host:port)."""
    assert NGINX is not None
    directory = Path(tempfile.mkdtemp(prefix="studio-nginx-"))
    directory.chmod(0o755)  # workers run as another user when we are root
    port = free_port()
    config = proxy_config(directory, port, upstream, servers, locations)
    log = directory / "nginx.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [*prefix, NGINX, "-e", "stderr", "-p", str(directory), "-c", str(config),
             "-g", f"daemon off; pid {directory / 'nginx.pid'};"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        _wait_for_port(port, process, log)
        yield Proxy(port=port, pid=process.pid, log=log, directory=directory)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        shutil.rmtree(directory, ignore_errors=True)
