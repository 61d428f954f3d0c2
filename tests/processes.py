"""Run the real entry points as child processes, the way operators start them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from service.settings import ROOT
from service.store.embedded import free_port


def studio_environ(**variables: str) -> dict[str, str]:
    """Return this environment without STUDIO_* variables, plus the given ones."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_")}
    return {**environ, **variables}


def wait_until_healthy(
    base_url: str, process: subprocess.Popen[str], timeout: float
) -> None:
    """Poll /healthz until it answers 200, or fail with the process's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"exited with {process.returncode}:\n{output}")
        try:
            with urllib.request.urlopen(f"{base_url}/healthz", timeout=1) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(0.05)
    raise AssertionError(f"{base_url} did not become healthy in {timeout}s")


@contextmanager
def running(
    command: str, variables: Mapping[str, str], timeout: float = 20.0
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start `python -m service COMMAND` on a free port and yield its base URL."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    environ = studio_environ(
        STUDIO_PORT=str(port), STUDIO_BASE_URL=base_url, **dict(variables)
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "service", command],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        wait_until_healthy(base_url, process, timeout)
        yield base_url, process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout:
            process.stdout.close()
