"""SIGTERM and SIGINT as a stop request that a loop polls between iterations.

A loop that sleeps between iterations must wake at once on the signal, and the signal must
never land in the middle of a statement. So the handler only records the request and writes a
byte to a pipe the sleeper selects on; the loop checks `requested` at its own safe points. A
`threading.Event` would be simpler but is not safe to set from a signal handler (its lock is
not reentrant: a signal arriving while the main thread holds it deadlocks the process).

The first signal asks for a graceful stop; it also restores the default handlers, so a second
signal ends the process the default way (a stuck statement is rolled back by the database).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from types import FrameType, TracebackType
from typing import Any

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Shutdown:
    """A stop request: set by SIGTERM/SIGINT (inside `with`) or by `request()`."""

    def __init__(self) -> None:
        self.signal: signal.Signals | None = None
        self.requested = False
        self._wake_read, self._wake_write = os.pipe()
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

    def request(self, signum: int | None = None) -> None:
        """Ask the loop to stop at its next safe point, waking it if it sleeps."""
        self.requested = True
        if signum is not None:
            self.signal = signal.Signals(signum)
        # A full pipe holds earlier wake-ups already: the sleeper wakes all the same.
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"\0")

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; return True (at once) when a stop was requested."""
        if not self.requested:
            select.select([self._wake_read], [], [], seconds)
        return self.requested

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        for stop_signal in STOP_SIGNALS:
            signal.signal(stop_signal, signal.SIG_DFL)
        self.request(signum)
