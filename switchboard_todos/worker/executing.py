"""Running a handler and recording its outcome: complete in batches, fail at once, or release.

A success waits at most ACK_DELAY for its runner's other successes and goes with them in one
`complete_many`; a failure is stored at once with `fail` (backoff and dead letters are the
core's business). A todo whose lease was lost, that was released, or that an operator
cancelled records nothing more.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from inspect import iscoroutinefunction
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.utils import timezone

from switchboard_todos import faults, handlers, outcomes, tracing
from switchboard_todos.exceptions import TodoCancelled, TodoConflict, TodoNotFound, UnknownKind
from switchboard_todos.models import State, Todo
from switchboard_todos.worker.databases import Databases
from switchboard_todos.worker.hand import Hand, Held, Runner, database_of, log, logger

if TYPE_CHECKING:
    from opentelemetry.trace import Span

#: A finished todo waits at most this long for its batch's acknowledgement.
ACK_DELAY = 0.1
#: How a todo of one source and kind runs (Executor._handler): its handler, the handler's
#: `finished` hook, its timeout in seconds.
_Handling = tuple[handlers.Handler, Callable[[Todo], None] | None, float | None]


class Executor:
    """Runs the todos of a runner's batch one after the other, and stores their outcomes."""

    def __init__(self, hand: Hand, databases: Databases, *, timeout: float | None) -> None:
        self.hand = hand
        self.databases = databases
        self.timeout = timeout
        self._handlers: dict[tuple[str, str], _Handling] = {}

    # Running

    def execute(self, runner: Runner, held: Held) -> None:
        """Run `held`'s handler on this thread; keep a success for the runner's next flush."""
        hand = self.hand
        todo = held.todo
        # In `running` before the stop check: an abort releases it, or the check sees the stop.
        hand.running[todo.id] = held
        if hand.stopping.is_set() or time.monotonic() - held.leased_at > hand.ttl / 2:
            # Stopping, or waited so long in the batch that its lease could expire mid-run.
            hand.running.pop(todo.id, None)
            self.release(held)
            return
        if held.tracer is None:
            self._run(runner, held, None)
            return
        with tracing.processing(held.tracer, todo) as span:
            self._run(runner, held, span)

    def _run(self, runner: Runner, held: Held, span: Span | None) -> None:
        """Run `held`'s handler, within its span when traced (tracing.processing); a failure
        is stored at once, in the span."""
        hand = self.hand
        todo = held.todo
        started = time.perf_counter()
        held.runner, held.started = runner, time.monotonic()
        try:
            handler, held.finished, held.timeout = self._handler(todo)
            with handlers.running(held.running):
                value = outcomes.result(handler(todo))
        except BaseException as error:
            tracing.failed(span, error)
            held.returned = True
            if held.dropped:
                return  # failed at its timeout, or cancelled: no longer a runner's todo
            seconds = time.perf_counter() - started
            runner.record(seconds)
            hand.running.pop(todo.id, None)
            # Still inside `except`: a `finished` hook (task_finished) logs the traceback.
            self.fail(held, error, seconds)
            return
        held.returned = True
        if held.dropped:
            return
        seconds = time.perf_counter() - started
        runner.record(seconds)
        if not runner.acks:
            runner.oldest_ack = time.monotonic()
        runner.acks[todo.id] = (held, value, seconds)

    def ack_due(self, runner: Runner) -> bool:
        """Whether the runner's oldest success has waited ACK_DELAY for its acknowledgement."""
        return bool(runner.acks) and time.monotonic() - runner.oldest_ack >= ACK_DELAY

    def _handler(self, todo: Todo) -> _Handling:
        """How `todo` runs: its kind's handler (or the django.tasks runner), that handler's
        `finished` hook, and how long it may run (its own timeout, else the worker's).
        Looked up once per source and kind."""
        key = (todo.source, todo.kind)
        found = self._handlers.get(key)
        if found is not None:
            return found
        timeout = self.timeout
        if todo.source == handlers.TASKS_SOURCE:
            from switchboard_todos.backends import TaskRunner

            runs: handlers.Handler = TaskRunner()
        else:
            registered = handlers.get_handler(todo.kind)
            if registered is None:
                raise UnknownKind(
                    f"No handler for kind {todo.kind!r} in this worker; register one with "
                    f"@handler({todo.kind!r}) in a todo_handlers module."
                )
            runs = async_to_sync(registered) if iscoroutinefunction(registered) else registered
            own = handlers.get_timeout(todo.kind)
            if own is not None:
                timeout = own
        found = self._handlers[key] = (runs, getattr(runs, "finished", None), timeout)
        return found

    # Storing outcomes

    def flush(self, runner: Runner) -> None:
        """Acknowledge the runner's finished todos with one `complete_many` per database."""
        if not runner.acks:
            return
        acks, runner.acks = runner.acks, {}
        by_database: dict[str, dict[str, tuple[Held, Any, float]]] = {}
        for todo_id, ack in acks.items():
            if ack[0].dropped:
                # Its handler returned as the watchdog gave up on it, which said why.
                continue
            by_database.setdefault(database_of(ack[0].todo), {})[todo_id] = ack
        for alias, database_acks in by_database.items():
            self._flush_database(runner, alias, database_acks)

    def _flush_database(
        self, runner: Runner, alias: str, acks: dict[str, tuple[Held, Any, float]]
    ) -> None:
        """Acknowledge finished todos of database `alias` with one `complete_many`."""
        hand = self.hand
        manager = self.databases.managers[alias]
        results = {
            todo_id: value
            for todo_id, (held, value, _) in acks.items()
            if not held.lost and not held.released and not held.running.cancelled
        }
        began = tracing.started()
        try:
            stored = set(
                self.databases.run(
                    "complete_many", manager.complete_many, hand.owner, results, database=alias
                )
            )
        except faults.DatabaseUnavailable:
            # Keep them for the next flush; their leases expire if the database stays away.
            runner.acks = {**acks, **runner.acks}
            return
        except Exception:
            # The database refused one result, and with it the whole statement: store them
            # one at a time, so that only the todo at fault fails.
            logger.warning(
                "worker %s: a batch acknowledgement was refused", hand.owner, exc_info=True
            )
            stored = self._complete_each(runner, alias, acks, results)
        else:
            if began is not None:
                done = [acks[todo_id][0].todo for todo_id in results if todo_id in stored]
                tracing.settled(began, "complete_many", done, hand.owner)
            missed = {todo_id: value for todo_id, value in results.items() if todo_id not in stored}
            if missed:
                # Say why: each one's `complete` misses too, and tells a cancel from a loss.
                stored |= self._complete_each(runner, alias, acks, missed)
        with hand.lock:
            hand.stats.done += len(stored)
        for todo_id, (held, value, seconds) in acks.items():
            hand.running.pop(todo_id, None)
            todo = held.todo
            if todo_id not in stored:
                self._lost(held, seconds)
                continue
            log(todo, "done", seconds)
            if held.finished is not None:
                todo.state, todo.result, todo.completed_at = State.DONE, value, timezone.now()
            self._finished_hook(held, todo)

    def _complete_each(
        self,
        runner: Runner,
        alias: str,
        acks: dict[str, tuple[Held, Any, float]],
        results: dict[str, Any],
    ) -> set[str]:
        """Complete `results` one by one; a refused one fails its todo and leaves `acks`."""
        stored = set()
        complete = self.databases.managers[alias].complete
        for todo_id, value in results.items():
            try:
                self.databases.run(
                    "complete", complete, todo_id, self.hand.owner, value, tries=1, database=alias
                )
            except TodoCancelled:
                acks[todo_id][0].running.cancelled = True  # reported with the others
            except (TodoConflict, TodoNotFound):
                continue  # lost: reported with the others
            except faults.DatabaseUnavailable:
                runner.acks[todo_id] = acks.pop(todo_id)  # the next flush tries again
            except Exception as refusal:
                held, _, seconds = acks.pop(todo_id)
                self.hand.running.pop(todo_id, None)
                self.fail(held, refusal, seconds)
            else:
                stored.add(todo_id)
        return stored

    def fail(self, held: Held, error: BaseException, seconds: float) -> None:
        """Store a failed attempt (retried, or dead-lettered at the cap), unless it was lost."""
        hand = self.hand
        todo = held.todo
        if held.lost or held.released or held.running.cancelled:
            self._lost(held, seconds)
            return
        try:
            stored = self._store_failure(todo, error)
        except TodoCancelled:
            held.running.cancelled = True
            self._lost(held, seconds)
            return
        except (TodoConflict, TodoNotFound):
            self._lost(held, seconds)
            return
        except Exception as refusal:
            # Not even the fixed-shape detail was stored: the lease expires and the todo runs
            # again, its attempt counted, so that it dead-letters at its cap all the same.
            log(
                todo,
                f"failed, not stored ({type(refusal).__name__}): it runs again when its "
                "lease expires",
                seconds,
                error=error,
                level=logging.WARNING,
            )
            return
        dead = stored.state == State.FAILED
        with hand.lock:
            hand.stats.failed += 1
            hand.stats.dead_lettered += dead
        retry = stored.next_retry_at
        log(
            todo,
            "dead-lettered" if dead else f"failed, retry at {retry:%Y-%m-%d %H:%M:%S%z}",
            seconds,
            error=error,
            level=logging.WARNING if dead else logging.INFO,
        )
        self._finished_hook(held, stored)

    def _store_failure(self, todo: Todo, error: BaseException) -> Todo:
        """Fail `todo` with the error's detail, or a fixed-shape one if that is refused."""
        alias = database_of(todo)
        fail = self.databases.managers[alias].fail
        owner = self.hand.owner
        try:
            return self.databases.run(
                "fail", fail, todo.id, owner, outcomes.error_detail(error), database=alias
            )
        except (TodoConflict, TodoNotFound, faults.DatabaseUnavailable):
            raise
        except Exception as refusal:
            logger.warning("todo %s: its error detail was refused", todo.id, exc_info=True)
            return self.databases.run(
                "fail",
                fail,
                todo.id,
                owner,
                outcomes.fallback_error(error, refusal),
                database=alias,
            )

    def _finished_hook(self, held: Held, stored: Todo) -> None:
        """Tell the handler its outcome is stored; its errors are logged, never raised."""
        if held.finished is None:
            return
        try:
            held.finished(stored)
        except Exception:
            logger.exception("todo %s: the finished hook failed", stored.id)

    def _lost(self, held: Held, seconds: float) -> None:
        """Count and log a todo whose outcome was not stored: no longer held, or cancelled."""
        if held.released:
            return
        if held.running.cancelled:
            self.cancelled(held, seconds)
            return
        with self.hand.lock:
            self.hand.stats.lost += 1
        log(held.todo, "lost: the lease went to another worker", seconds, level=logging.WARNING)

    def cancelled(self, held: Held, seconds: float) -> None:
        """Count and log, once, a todo an operator cancelled; nothing more is stored for it."""
        with self.hand.lock:
            self.hand.stats.cancelled += 1
        log(
            held.todo,
            "cancelled by an operator: its handler's outcome is dropped",
            seconds,
            level=logging.WARNING,
        )

    def release(self, held: Held) -> None:
        """Give a todo's lease back (the attempt not counted); a lost one is left alone."""
        try:
            alias = database_of(held.todo)
            self.databases.run(
                "release",
                self.databases.managers[alias].release,
                held.todo.id,
                self.hand.owner,
                database=alias,
            )
        except (TodoConflict, TodoNotFound, faults.DatabaseUnavailable):
            return  # done or lost meanwhile, or the lease expires by itself
        with self.hand.lock:
            self.hand.stats.released += 1
        log(held.todo, "released", 0.0)

    def release_batch(self, runner: Runner) -> None:
        """Give back the todos of a runner's batch that have not started."""
        while True:
            try:
                held = runner.batch.popleft()
            except IndexError:
                return
            self.release(held)
