"""The watchdog: handlers the worker stops waiting for (past their timeouts, or cancelled by an
operator), and the batches stuck behind slow handlers."""

from __future__ import annotations

import time
from collections.abc import Callable

from switchboard_todos.exceptions import HandlerTimeout
from switchboard_todos.worker.executing import Executor
from switchboard_todos.worker.hand import Hand, Held, Runner, logger

#: A claimed todo still waiting in its batch after this many seconds goes back to the queue for
#: other workers: a handler ahead of it ran far longer than the batch was sized for.
UNSTARTED_LIMIT = 1.0
#: A handler without a timeout that has run this many TTLs is logged as possibly hung.
HUNG_WARNING_TTLS = 3


class Watchdog:
    """Fails a todo whose handler overran, and drops one an operator cancelled, giving the
    runner's place to a fresh thread; releases the todos waiting behind a slow handler; warns
    of long runs without a timeout.

    `start` starts a runner's thread; `abort` releases everything in hand and ends the worker.
    """

    def __init__(
        self,
        hand: Hand,
        executor: Executor,
        *,
        start: Callable[[Runner], None],
        abort: Callable[[], None],
    ) -> None:
        self.hand = hand
        self.executor = executor
        self._start = start
        self._abort = abort

    def watch(self) -> None:
        """One round: the handlers past their timeouts, then the batches stuck behind them."""
        self._watch_handlers()
        self._release_stuck_batches()

    def _watch_handlers(self) -> None:
        """Drop each todo cancelled under its handler; fail each whose handler ran past its
        timeout; warn of long ones without one."""
        hand = self.hand
        now = time.monotonic()
        for held in list(hand.running.values()):
            if held.started is None or held.lost or held.released:
                continue
            ran = now - held.started
            if held.running.cancelled:
                if not held.returned:  # else its outcome, refused, is told when flushed
                    self._drop_cancelled(held, ran)
            elif held.timeout is not None and ran > held.timeout:
                self._time_out(held, ran)
            elif held.timeout is None and not held.warned and ran > HUNG_WARNING_TTLS * hand.ttl:
                held.warned = True
                logger.warning(
                    "todo %s kind=%s: its handler has run %.0fs (%d leases) and has no "
                    "timeout; if it hangs it keeps its lease forever: set "
                    "@handler(..., timeout=) or todo_worker --timeout",
                    held.todo.id,
                    held.todo.kind,
                    ran,
                    HUNG_WARNING_TTLS,
                )

    def _time_out(self, held: Held, ran: float) -> None:
        """Fail a todo whose handler overran, and give its runner's place to a fresh thread.

        The attempt counts, so a todo that always hangs is dead-lettered at its cap. A thread
        cannot be killed: the hung one runs on, its outcome dropped, until its handler
        returns. When more threads hang than the worker has runners, the process exits
        non-zero, the one way to end them, and its supervisor starts a fresh one.
        """
        held.dropped = True
        self.hand.running.pop(held.todo.id, None)
        error = HandlerTimeout(
            f"The handler ran past its timeout of {held.timeout:g}s and was abandoned (still "
            f"running after {ran:.1f}s)."
        )
        self.executor.fail(held, error, ran)
        held.lost = True
        self._replace(held.runner)

    def _drop_cancelled(self, held: Held, ran: float) -> None:
        """Stop waiting for the handler of a todo an operator cancelled, as for one that
        overran: nothing more is stored for it, and a fresh thread takes its runner's place.
        The handler sees `todo_cancelled()` (or TodoCancelled at `report_progress`) and can
        return; whatever it returns is dropped."""
        held.dropped = True
        self.hand.running.pop(held.todo.id, None)
        self.executor.cancelled(held, ran)
        self._replace(held.runner)

    def _replace(self, runner: Runner | None) -> None:
        """Give the place of `runner`, whose thread is stuck in a handler, to a fresh one.

        The fresh runner takes the successes awaiting their acknowledgement and stores them
        first, stopping or not: left behind, they would keep their leases, heartbeat after
        heartbeat, until the stuck handler returned.
        """
        hand = self.hand
        if runner is None or runner.abandoned:
            return
        runner.abandoned = True
        self.executor.release_batch(runner)
        fresh = Runner(runner.index)
        fresh.acks, runner.acks = runner.acks, {}
        fresh.oldest_ack = runner.oldest_ack
        with hand.lock:
            hand.abandoned = [r for r in hand.abandoned if r.thread and r.thread.is_alive()]
            hand.abandoned.append(runner)
            hung = len(hand.abandoned)
        if hung <= hand.concurrency:
            # Started before it takes the place: the supervisor, which returns once no
            # runner's thread is alive, never sees the place without one.
            self._start(fresh)
        with hand.lock:
            hand.runners[hand.runners.index(runner)] = fresh
        if hung > hand.concurrency:
            logger.error(
                "worker %s: %d handler threads hung past their timeouts or cancellation; "
                "exiting so that the process is restarted",
                hand.owner,
                hung,
            )
            with hand.lock:
                hand.crashed.append(f"{hung} hung handler threads")
            self.executor.flush(fresh)
            self._abort()

    def _release_stuck_batches(self) -> None:
        """Release the waiting todos of any batch stuck behind a handler that overran."""
        now = time.monotonic()
        for runner in self.hand.runners:
            try:
                waited = now - runner.batch[0].leased_at
            except IndexError:
                continue
            if waited > UNSTARTED_LIMIT:
                logger.info(
                    "worker %s: releasing %d todos waiting %.1fs behind a slow handler",
                    self.hand.owner,
                    len(runner.batch),
                    waited,
                )
                self.executor.release_batch(runner)
