"""Shutdown: signals, `max_seconds` and the shutdown timeout, and the threads that crash."""

from __future__ import annotations

import time

from switchboard_todos.shutdown import Shutdown
from switchboard_todos.worker.executing import Executor
from switchboard_todos.worker.hand import Hand, logger


class Supervisor:
    """Watches, on the calling thread, for the reasons to stop, and stops.

    The first SIGTERM (or `max_seconds`) stops claiming and gives back the batches not
    started; the todos running finish. A second signal, or `shutdown_timeout` after the stop,
    releases every todo in hand and returns at once.
    """

    def __init__(
        self,
        hand: Hand,
        executor: Executor,
        *,
        max_seconds: float | None,
        shutdown_timeout: float | None,
    ) -> None:
        self.hand = hand
        self.executor = executor
        self.max_seconds = max_seconds
        self.shutdown_timeout = shutdown_timeout

    def supervise(self, signals: Shutdown) -> None:
        """Return when every runner thread has ended, or after an abort."""
        hand = self.hand
        started = time.monotonic()
        signals_seen = 0
        buffers_released = False
        stopped_at: float | None = None
        while True:
            if signals.count > signals_seen:
                signals_seen = signals.count
                if signals_seen == 1:
                    logger.info("worker %s: stopping; the todos in hand finish first", hand.owner)
                    hand.stop()
                else:
                    logger.info("worker %s: releasing the todos in hand and exiting", hand.owner)
                    self.abort()
                    return
            if self.max_seconds is not None and time.monotonic() - started >= self.max_seconds:
                hand.stop()
            if hand.stopping.is_set() and not buffers_released:
                buffers_released = True
                stopped_at = time.monotonic()
                for runner in hand.runners:
                    self.executor.release_batch(runner)
            if (
                stopped_at is not None
                and self.shutdown_timeout is not None
                and time.monotonic() - stopped_at >= self.shutdown_timeout
            ):
                logger.warning(
                    "worker %s: the todos in hand did not finish within the shutdown timeout "
                    "(%gs); releasing them and exiting",
                    hand.owner,
                    self.shutdown_timeout,
                )
                self.abort()
                return
            alive = [
                runner.thread
                for runner in list(hand.runners)
                if runner.thread is not None and runner.thread.is_alive()
            ]
            if not alive:
                return
            alive[0].join(0.05)

    def abort(self) -> None:
        """Release every todo in hand, running or not; their handlers' outcomes are dropped."""
        hand = self.hand
        hand.stop()
        for runner in hand.runners:
            self.executor.release_batch(runner)
        for held in list(hand.running.values()):
            held.released = True
            self.executor.release(held)

    def crash(self, thread: str) -> None:
        """A worker thread died of a bug, not of a todo: stop, and make `run()` raise.

        Called in the `except` block, so the traceback is logged. The process then exits
        non-zero, and its supervisor (systemd's Restart=on-failure) starts a fresh one.
        """
        logger.exception("worker %s: %s crashed", self.hand.owner, thread)
        with self.hand.lock:
            self.hand.crashed.append(thread)
        self.hand.stop()
