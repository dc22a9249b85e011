"""SIGTERM and SIGINT as a stop request that a loop polls between iterations.

A loop that sleeps between iterations must wake at once on the signal, and the signal must
never land in the middle of a statement. So the handler only records the request and writes a
byte to a pipe the sleeper selects on; the loop checks `requested` at its own safe points. A
`threading.Event` would be simpler but is not safe to set from a signal handler (its lock is
not reentrant: a signal arriving while the main thread holds it deadlocks the process).

By default the first signal asks for a graceful stop and restores the default handlers, so a
second signal ends the process the default way (a stuck statement is rolled back by the
database): the reaper's contract. With `every_signal=True` the handlers stay and each signal is
counted, for loops that act on the second one themselves (the worker releases its todos, the
demo passes it on to its children).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Shutdown:
    """A stop request: set by SIGTERM/SIGINT (inside `with`) or by `request()`."""

    def __init__(self, *, every_signal: bool = False) -> None:
        self.signal: signal.Signals | None = None
        #: How many stop requests came (signals, and calls of `request`).
        self.count = 0
        self._every_signal = every_signal
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Shutdown:
        # Handlers can only be installed from the main thread; elsewhere only request() stops.
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        os.close(self._wake_read)
        os.close(self._wake_write)

    @property
    def requested(self) -> bool:
        return self.count > 0

    def request(self, signum: int | None = None) -> None:
        """Ask the loop to stop at its next safe point, waking it if it sleeps."""
        self.count += 1
        if signum is not None:
            self.signal = signal.Signals(signum)
        # A full pipe holds earlier wake-ups already: the sleeper wakes all the same.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"\0")

    def wait(self, seconds: float, seen: int = 0) -> bool:
        """Sleep up to `seconds`; return True as soon as more than `seen` requests came."""
        deadline = time.monotonic() + seconds
        while self.count <= seen:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            # Short sleeps: another thread waiting too may drain the wake-up byte first.
            if select.select([self._wake_read], [], [], min(left, 0.05))[0]:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_read, 512)
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self._every_signal:
            for stop_signal in STOP_SIGNALS:
                signal.signal(stop_signal, signal.SIG_DFL)
        self.request(signum)
