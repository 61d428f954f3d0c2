"""The command line: `serve` for production and `dev` for `make run`."""

from __future__ import annotations

import signal
import smtplib
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from email.message import EmailMessage
from pathlib import Path

import pytest

from service.settings import ROOT
from service.store.embedded import RedisServer

from .conftest import TEST_SECRET
from .ports import free_port
from .processes import output_of, running, studio_environ


def _run(*variables: tuple[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "service", "serve"],
        cwd=ROOT,
        env=studio_environ(**dict(variables)),
        capture_output=True,
        text=True,
        timeout=30,
    )


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        ((("STUDIO_SECRET_KEY", TEST_SECRET),), "STUDIO_REDIS_URL: required by serve"),
        (
            (("STUDIO_REDIS_URL", "redis://127.0.0.1:1/0"),),
            "STUDIO_SECRET_KEY: required",
        ),
        ((("STUDIO_PORT", "http"),), "STUDIO_PORT: must be an integer"),
    ],
)
def test_serve_with_a_bad_setting_exits_2_with_one_line(
    variables: tuple[tuple[str, str], ...], line: str
) -> None:
    """No half-configured start: one line on stderr, exit status 2."""
    result = _run(*variables)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert line in lines[0]


def test_serve_answers_and_stops_cleanly(redis_server: RedisServer) -> None:
    """The production entry point serves the public surface and exits 0 on SIGTERM."""
    variables = {"STUDIO_REDIS_URL": redis_server.url, "STUDIO_SECRET_KEY": TEST_SECRET}
    with running("serve", variables) as (base_url, process):
        with urllib.request.urlopen(f"{base_url}/en") as response:
            assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        # A request its parser refuses: JSON, as every error (hardening.py).
        url = urllib.parse.urlsplit(base_url)
        with socket.create_connection((url.hostname, url.port), timeout=5) as sock:
            sock.sendall(b"GET /x HTTP/1.1 junk\r\n\r\n")
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
        assert answer.startswith(b"HTTP/1.0 400 ")
        assert answer.endswith(b'\r\n\r\n{"error": "BAD_REQUEST"}')
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_dev_runs_redis_with_aof_a_mail_catcher_and_the_service(tmp_path: Path) -> None:
    """`make run`'s command starts all three; Ctrl-C stops all three."""
    smtp_port = free_port()
    variables = {"STUDIO_DATA_DIR": str(tmp_path), "STUDIO_SMTP_PORT": str(smtp_port)}
    with running("dev", variables, timeout=30) as (base_url, process):
        with urllib.request.urlopen(f"{base_url}/healthz") as response:
            assert response.status == 200
        message = EmailMessage()
        message["From"], message["To"] = "a@example.com", "b@example.com"
        message["Subject"] = "hello"
        message.set_content("Your code is 1234 5678")
        with smtplib.SMTP("127.0.0.1", smtp_port, timeout=5) as smtp:
            smtp.send_message(message)
        assert (tmp_path / "secret_key").read_text().strip()
        assert any((tmp_path / "redis").iterdir()), "AOF files under the data dir"
        line = output_of(process).wait_for("embedded Redis on")
        redis_port = int(line.split("redis://127.0.0.1:")[1].split("/")[0])
        output_of(process).wait_for("Your code is 1234 5678")
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) == 0
        output = output_of(process).text()
    assert "Your code is 1234 5678" in output
    assert not _port_open(redis_port)
    assert not _port_open(smtp_port)
