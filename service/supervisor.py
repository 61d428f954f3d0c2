"""Run `serve --workers N`: N processes on one port, each with its own socket.

Each child is a whole `python -m service serve` that binds the port with
SO_REUSEPORT, so the kernel spreads new connections over the children by
their 4-tuple hash and no process accepts for another. This supervisor only
starts them, starts again one that dies (slower and slower if it keeps dying
at once; it gives up after a few such deaths in a row), and on SIGTERM or
SIGINT passes SIGTERM on and waits for all, killing those that outlive the
grace period. It holds no socket and loads no application.

The children run in a process group of their own, so a terminal's Ctrl-C or
a group-wide signal reaches them once, through here, and each dies with this
process if it is killed outright (Linux), rather than keep a share of the
port as a stray.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Final

_LOGGER: Final = logging.getLogger(__name__)

# A child that lived less than this died "at once": it is restarted after a
# growing delay, and RESTART_LIMIT such deaths in a row of one slot stop it all.
MIN_UPTIME: Final = 5.0
RESTART_LIMIT: Final = 5
MAX_DELAY: Final = 2.0
# How often the supervisor looks at its children; signals are handled at once.
TICK: Final = 0.05
# The exit status of a child that found a bad setting: restarting cannot help.
CONFIG_ERROR: Final = 2
_PR_SET_PDEATHSIG: Final = 1


@dataclass(slots=True)
class _Slot:
    index: int
    process: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    quick_deaths: int = 0
    restart_at: float | None = 0.0


def _die_with_parent() -> Callable[[], None] | None:
    """Return a pre-exec hook that makes a child get SIGTERM when we die (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # we died before the hook ran
            os._exit(1)

    return hook


class Supervisor:
    """Keep `workers` copies of one command running until told to stop."""

    def __init__(
        self,
        command: Sequence[str],
        workers: int,
        *,
        grace: float = 15.0,
        environ: Callable[[int], Mapping[str, str]] | None = None,
    ) -> None:
        self._command = list(command)
        # A slot keeps its index across restarts: what environ(index) gives it.
        self._slots = [_Slot(index) for index in range(workers)]
        self._environ = environ
        self._grace = grace
        self._stop_deadline: float | None = None
        self._killed = False
        self._status = 0
        self._hook = _die_with_parent()

    def run(self) -> int:
        """Supervise until every child has exited after a stop; return the status."""
        previous = {
            signum: signal.signal(signum, self._on_signal)
            for signum in (signal.SIGTERM, signal.SIGINT)
        }
        try:
            self._supervise()
        except BaseException:
            self._signal_all(signal.SIGTERM)
            raise
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
        return 1 if self._killed and not self._status else self._status

    def _supervise(self) -> None:
        _LOGGER.info("supervising %d serve processes", len(self._slots))
        while True:
            now = time.monotonic()
            self._reap(now)
            if self._stop_deadline is None:
                self._start_due(now)
            elif not any(slot.process for slot in self._slots):
                break
            elif now > self._stop_deadline and not self._killed:
                self._killed = True
                self._signal_all(signal.SIGKILL)
                _LOGGER.warning("serve processes outlived %gs: killed", self._grace)
            time.sleep(TICK)

    def stop(self, status: int = 0) -> None:
        """Pass SIGTERM to every child; they get `grace` seconds to finish."""
        if self._stop_deadline is not None:
            return
        self._status = status
        self._stop_deadline = time.monotonic() + self._grace
        self._signal_all(signal.SIGTERM)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        _LOGGER.info("%s: stopping the serve processes", signal.Signals(signum).name)
        self.stop()

    def _signal_all(self, signum: int) -> None:
        for slot in self._slots:
            if slot.process and slot.process.poll() is None:
                slot.process.send_signal(signum)

    def _start_due(self, now: float) -> None:
        for slot in self._slots:
            due = slot.restart_at is not None and now >= slot.restart_at
            if slot.process is None and due:
                self._start(slot, now)

    def _start(self, slot: _Slot, now: float) -> None:
        slot.process = subprocess.Popen(
            self._command,
            stdin=subprocess.DEVNULL,
            env=self._environ(slot.index) if self._environ else None,
            process_group=0,
            preexec_fn=self._hook,  # safe: the supervisor runs no threads
        )
        slot.started = now
        slot.restart_at = None

    def _reap(self, now: float) -> None:
        for slot in self._slots:
            if slot.process is None or (code := slot.process.poll()) is None:
                continue
            pid = slot.process.pid
            slot.process = None
            if self._stop_deadline is not None:
                continue
            if code == CONFIG_ERROR:
                _LOGGER.error("serve process %d: configuration error; stopping", pid)
                self.stop(CONFIG_ERROR)
                continue
            quick = now - slot.started < MIN_UPTIME
            slot.quick_deaths = slot.quick_deaths + 1 if quick else 0
            if slot.quick_deaths >= RESTART_LIMIT:
                _LOGGER.error(
                    "serve process %d died %d times in a row at start; stopping",
                    pid,
                    slot.quick_deaths,
                )
                self.stop(1)
                continue
            delay = min(MAX_DELAY, 0.1 * 2**slot.quick_deaths) if quick else 0.0
            _LOGGER.warning(
                "serve process %d exited with %d; restarting in %.1fs", pid, code, delay
            )
            slot.restart_at = now + delay
