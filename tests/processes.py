"""Run the real entry points as child processes, the way operators start them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from service.settings import ROOT

from .ports import free_port


def studio_environ(**variables: str) -> dict[str, str]:
    """Return this environment without STUDIO_* variables, plus the given ones."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("STUDIO_")}
    return {**environ, **variables}


class Output:
    """Everything a child process printed, line by line, as it arrives."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def drain(self, process: subprocess.Popen[str]) -> None:
        """Read the child's output until it closes (runs in a thread)."""
        assert process.stdout is not None
        for line in process.stdout:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()

    def text(self) -> str:
        """Return all output so far."""
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, needle: str, timeout: float = 20.0) -> str:
        """Return the first line containing `needle`, waiting for it to appear."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in self.lines:
                    if needle in line:
                        return line
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no line with {needle!r}")
                self._changed.wait(left)


_OUTPUTS: weakref.WeakKeyDictionary[subprocess.Popen[str], Output] = (
    weakref.WeakKeyDictionary()
)


def drain(process: subprocess.Popen[str]) -> threading.Thread:
    """Collect a child's output as it comes, in a thread; join it after the exit.

    A busy child's log must never block on a full pipe. Tests read it through
    output_of(process).
    """
    _OUTPUTS[process] = collected = Output()
    reader = threading.Thread(target=collected.drain, args=(process,), daemon=True)
    reader.start()
    return reader


def output_of(process: subprocess.Popen[str]) -> Output:
    """Return the collected output of a process started by `running`."""
    return _OUTPUTS[process]


def wait_until_healthy(
    base_url: str, process: subprocess.Popen[str], timeout: float
) -> None:
    """Poll /healthz until it answers 200, or fail with the process's output."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            collected = _OUTPUTS.get(process)
            if collected is not None:
                output = collected.text()
            else:
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
    command: str,
    variables: Mapping[str, str],
    timeout: float = 20.0,
    arguments: Sequence[str] = (),
) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """Start `python -m service COMMAND` on a free port and yield its base URL."""
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    environ = studio_environ(
        STUDIO_PORT=str(port), STUDIO_BASE_URL=base_url, **dict(variables)
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "service", command, *arguments],
        cwd=ROOT,
        env=environ,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    reader = drain(process)
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
        reader.join(timeout=5)
        if process.stdout:
            process.stdout.close()
