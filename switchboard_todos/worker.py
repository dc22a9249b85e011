"""The todo worker: claim in batches, run handlers on threads, heartbeat, acknowledge in batches.

`Worker(queues, ...).run()` runs until stopped (SIGTERM/SIGINT, `stop()`, `max_todos`,
`max_seconds`); `manage.py todo_worker` is a thin command around it. The moving parts:

* `concurrency` runner threads. Each claims its own batches with `claim_batch`, runs them one
  after the other, and acknowledges the successes with one `complete_many` per batch; a
  failure is stored at once with `fail` (backoff and dead letters are the core's business).
  A batch is sized so that its last todo starts within PREFETCH_WINDOW of the claim: quick
  handlers get batches of up to `batch_size`, slow ones a single todo, so a worker never sits
  on todos another worker could be running.
* One heartbeat thread extends the lease of every running todo when a third of the TTL has
  passed since the lease was last set. A heartbeat that finds the lease gone marks the todo
  lost: its outcome is then not stored, as another worker owns it now.
* One listener thread (`listen.Listener`) wakes idle runners when a todo is enqueued in one of
  their queues; they also poll, as some todos become claimable without a notification.
* The calling thread supervises: signals, `max_seconds`, and releasing held todos.

Faults of the database (a terminated backend, a restarting or frozen server, a failover that
leaves it read-only: `faults`) close that thread's connection, and the worker backs off until
the database is back, logging one line when the fault begins and one when it ends. A claim
whose answer was lost lapses after the TTL and is claimed again, an acknowledgement is
retried: no todo is lost, though one may run twice.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from inspect import iscoroutinefunction
from typing import Any, TypeVar

from asgiref.sync import async_to_sync
from django.db import DatabaseError, connections
from django.utils import timezone

from switchboard_todos import faults, handlers, outcomes, validation
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import (
    HandlerTimeout,
    TodoConflict,
    TodoNotFound,
    UnknownKind,
    WorkerCrashed,
)
from switchboard_todos.listen import Doorbell, Listener, PollSchedule
from switchboard_todos.models import State, Todo
from switchboard_todos.queues import QueueSelection
from switchboard_todos.shutdown import Shutdown

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: The claim-to-start delay a batch may add to its last todo, in seconds (and at most TTL/10).
PREFETCH_WINDOW = 0.2
#: A claimed todo still waiting in its batch after this many seconds goes back to the queue for
#: other workers: a handler ahead of it ran far longer than the batch was sized for.
UNSTARTED_LIMIT = 1.0
#: A finished todo waits at most this long for its batch's acknowledgement.
ACK_DELAY = 0.1
#: A handler without a timeout that has run this many TTLs is logged as possibly hung.
HUNG_WARNING_TTLS = 3
#: Tries of a statement that failed for a fault of the database (a broken connection, say).
_DB_TRIES = 3


def default_owner() -> str:
    """A worker id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


@dataclass
class WorkerStats:
    """What a worker did, returned by `run()`."""

    claimed: int = 0
    done: int = 0
    failed: int = 0
    dead_lettered: int = 0
    released: int = 0
    lost: int = 0


class _Held:
    """A todo this worker claimed: waiting in a runner's batch, running, or awaiting its ack."""

    __slots__ = (
        "todo", "leased_at", "finished", "lost", "released", "runner", "started", "timeout",
        "timed_out", "warned",
    )  # fmt: skip

    def __init__(self, todo: Todo, leased_at: float) -> None:
        self.todo = todo
        self.leased_at = leased_at  # monotonic time the lease was last set (claim, heartbeat)
        self.finished: Callable[[Todo], None] | None = None
        self.lost = False
        self.released = False
        self.runner: _Runner | None = None  # the runner whose thread runs its handler
        self.started: float | None = None  # monotonic time its handler started
        self.timeout: float | None = None
        self.timed_out = False  # failed at its timeout while its handler ran on
        self.warned = False  # logged as possibly hung


class _Runner:
    """One runner thread's state: its batch, its unacknowledged successes, its pace."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.thread: threading.Thread | None = None
        self.abandoned = False  # its handler ran past its timeout; a fresh runner took its place
        self.batch: deque[_Held] = deque()
        self.acks: dict[str, tuple[_Held, Any, float]] = {}
        self.oldest_ack = 0.0
        self.average: float | None = None  # seconds per todo, moving average

    def record(self, seconds: float) -> None:
        self.average = seconds if self.average is None else 0.8 * self.average + 0.2 * seconds


class Worker:
    """Run the handler of each todo claimed from `queues` until stopped.

    `concurrency` todos run at once, on threads; `ttl` is the lease, in seconds; `listen`
    defaults to SWITCHBOARD_TODOS_LISTEN; `poll_interval` caps the wait between claims that
    found nothing. `max_todos` stops after claiming that many, `max_seconds` after that long;
    both let the todos in hand finish first, as the first SIGTERM or `stop()` does.
    `timeout` bounds a handler's run (a handler's own `@handler(timeout=)` wins): past it the
    attempt fails and a fresh runner thread replaces the hung one. `shutdown_timeout` bounds
    the drain after a stop: past it the todos still in hand are released, as by a second
    SIGTERM. `databases` narrows the databases served (placement.py): by default each one a
    named queue lives in, or with `*` each one that holds todos; a todo's outcome goes to the
    database it was claimed from.
    """

    def __init__(
        self,
        queues: str | Iterable[str] = "default",
        *,
        exclude_queues: Iterable[str] = (),
        concurrency: int = 1,
        ttl: float | timedelta = 30.0,
        owner: str | None = None,
        batch_size: int = 100,
        listen: bool | None = None,
        poll_interval: float = 1.0,
        max_todos: int | None = None,
        max_seconds: float | None = None,
        timeout: float | timedelta | None = None,
        shutdown_timeout: float | timedelta | None = None,
        databases: Iterable[str] | None = None,
    ) -> None:
        self.selection = QueueSelection(queues, exclude=exclude_queues, databases=databases)
        self.queues = self.selection.named
        self.databases = self.selection.databases
        self.owner = validation.owner(owner if owner is not None else default_owner())
        self.ttl = validation.ttl(ttl).total_seconds()
        self.concurrency = validation.whole_number(concurrency, "concurrency", 1, 1000)
        self.batch_size = validation.whole_number(
            batch_size, "batch_size", 1, validation.CLAIM_BATCH_LIMIT
        )
        self.listen = conf.LISTEN if listen is None else listen
        self.poll_interval = validation.duration(
            poll_interval, "poll_interval", maximum=validation.MAX_WAIT, allow_zero=False
        ).total_seconds()
        self.max_todos = (
            None if max_todos is None else validation.whole_number(max_todos, "max_todos", 1, 2**62)
        )
        self.max_seconds = (
            None
            if max_seconds is None
            else validation.duration(
                max_seconds, "max_seconds", maximum=timedelta(days=366), allow_zero=False
            ).total_seconds()
        )
        self.timeout = None if timeout is None else validation.handler_timeout(timeout)
        self.shutdown_timeout = (
            None
            if shutdown_timeout is None
            else validation.duration(
                shutdown_timeout, "shutdown_timeout", maximum=timedelta(days=1), allow_zero=True
            ).total_seconds()
        )
        self._managers = {alias: Todo.objects.db_manager(alias) for alias in self.databases}
        self._turns = itertools.count()
        self.stats = WorkerStats()
        self._prefetch_window = min(PREFETCH_WINDOW, self.ttl / 10)
        self._doorbell = Doorbell(
            self.queues, capacity=self.concurrency, wants=self.selection.wants
        )
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self._reserved = 0
        self._running: dict[str, _Held] = {}
        self._runners = [_Runner(index) for index in range(self.concurrency)]
        self._abandoned: list[_Runner] = []
        self._stopping = threading.Event()
        self._finished = threading.Event()
        self._handlers: dict[str, handlers.Handler] = {}
        self._crashed: list[str] = []
        self._outages = {
            alias: faults.Outage(
                f"worker {self.owner}" + (f" (database {alias})" if len(self.databases) > 1 else "")
            )
            for alias in self.databases
        }

    # Running and stopping

    def run(self) -> WorkerStats:
        """Work until stopped; return what was done. A Worker runs once."""
        handlers.autodiscover()
        logger.info(
            "worker %s: queues %s, concurrency %d, ttl %gs, %s%s",
            self.owner,
            self.selection,
            self.concurrency,
            self.ttl,
            "listening" if self.listen else "polling",
            f", databases {','.join(self.databases)}" if len(self.databases) > 1 else "",
        )
        heartbeat = threading.Thread(target=self._heartbeats, name="todo-heartbeat", daemon=True)
        with ExitStack() as stack:
            for alias in self.databases:
                stack.enter_context(faults.timeouts(alias))
            signals = stack.enter_context(Shutdown(every_signal=True))
            self._work(heartbeat, signals)
        logger.info("worker %s stopped: %s", self.owner, self.stats)
        if self._crashed:
            raise WorkerCrashed(
                f"worker {self.owner}: {', '.join(self._crashed)} crashed (the traceback is "
                "logged above); the todos it held were released or lapse with their leases."
            )
        return self.stats

    def _work(self, heartbeat: threading.Thread, signals: Shutdown) -> None:
        try:
            if self.listen:
                for alias in self.databases:
                    listener = Listener(alias)
                    self._listeners.append(listener)
                    listener.subscribe(self._doorbell)
            heartbeat.start()
            for runner in self._runners:
                self._start(runner)
            self._supervise(signals)
        finally:
            self._finished.set()
            if heartbeat.is_alive():
                heartbeat.join()
            for listener in self._listeners:
                listener.stop()

    def _start(self, runner: _Runner) -> None:
        # Daemons: the runners of an aborted worker, or abandoned ones, may still be inside a
        # handler, and must not keep the process alive; their todos are released or failed.
        runner.thread = threading.Thread(
            target=self._run_runner,
            args=(runner,),
            name=f"todo-runner-{runner.index}",
            daemon=True,
        )
        runner.thread.start()

    def stop(self) -> None:
        """Stop claiming and let the todos in hand finish; safe from any thread."""
        self._stopping.set()
        self._doorbell.ring_all()

    def _crash(self, thread: str) -> None:
        """A worker thread died of a bug, not of a todo: stop, and make `run()` raise.

        Called in the `except` block, so the traceback is logged. The process then exits
        non-zero, and its supervisor (systemd's Restart=on-failure) starts a fresh one.
        """
        logger.exception("worker %s: %s crashed", self.owner, thread)
        with self._lock:
            self._crashed.append(thread)
        self.stop()

    def _supervise(self, signals: Shutdown) -> None:
        started = time.monotonic()
        signals_seen = 0
        buffers_released = False
        stopped_at: float | None = None
        while True:
            if signals.count > signals_seen:
                signals_seen = signals.count
                if signals_seen == 1:
                    logger.info("worker %s: stopping; the todos in hand finish first", self.owner)
                    self.stop()
                else:
                    logger.info("worker %s: releasing the todos in hand and exiting", self.owner)
                    self._abort()
                    return
            if self.max_seconds is not None and time.monotonic() - started >= self.max_seconds:
                self.stop()
            if self._stopping.is_set() and not buffers_released:
                buffers_released = True
                stopped_at = time.monotonic()
                for runner in self._runners:
                    self._release_batch(runner)
            if (
                stopped_at is not None
                and self.shutdown_timeout is not None
                and time.monotonic() - stopped_at >= self.shutdown_timeout
            ):
                logger.warning(
                    "worker %s: the todos in hand did not finish within the shutdown timeout "
                    "(%gs); releasing them and exiting",
                    self.owner,
                    self.shutdown_timeout,
                )
                self._abort()
                return
            alive = [
                runner.thread
                for runner in list(self._runners)
                if runner.thread is not None and runner.thread.is_alive()
            ]
            if not alive:
                return
            alive[0].join(0.05)

    def _abort(self) -> None:
        """Release every todo in hand, running or not; their handlers' outcomes are dropped."""
        self.stop()
        for runner in self._runners:
            self._release_batch(runner)
        for held in list(self._running.values()):
            held.released = True
            self._release(held)

    # A runner thread

    def _run_runner(self, runner: _Runner) -> None:
        schedule = PollSchedule(self.poll_interval, self._listeners)
        try:
            while not self._stopping.is_set():
                if not runner.batch:
                    self._flush(runner)
                    claimed = self._claim(runner)
                    if claimed is None:
                        break
                    if not claimed:
                        self._doorbell.wait(schedule.pause())
                        continue
                    schedule.reset()
                try:
                    held = runner.batch.popleft()
                except IndexError:
                    continue  # taken by the supervisor, which released it
                self._execute(runner, held)
                if runner.abandoned:
                    return  # a fresh runner took its place and its todos
                if runner.acks and time.monotonic() - runner.oldest_ack >= ACK_DELAY:
                    self._flush(runner)
            self._release_batch(runner)
            self._flush(runner)
        except Exception:
            self._crash(f"runner {runner.index}")
        finally:
            connections.close_all()

    def _claim(self, runner: _Runner) -> list[Todo] | None:
        """Claim the runner's next batch; None when `max_todos` is used up."""
        wanted = self.batch_size
        if runner.average is not None:
            wanted = min(wanted, max(1, int(self._prefetch_window / max(runner.average, 1e-6))))
        else:
            wanted = 1
        limit = self._reserve(wanted)
        if not limit:
            return None
        leased_at = time.monotonic()
        try:
            todos = self._claim_batch(limit)
        except faults.DatabaseUnavailable as unavailable:
            self._reserve(-limit)
            self._stopping.wait(unavailable.delay)
            return []
        if len(todos) < limit:
            self._reserve(len(todos) - limit)
        if self.max_todos is not None and self._reserved >= self.max_todos:
            self._doorbell.ring_all()  # the budget is spent: idle runners can go
        if todos:
            with self._lock:
                self.stats.claimed += len(todos)
            runner.batch.extend(_Held(todo, leased_at) for todo in todos)
            if len(todos) == limit and self.concurrency > 1:
                self._doorbell.ring()  # there may be more: wake an idle runner
        return todos

    def _claim_batch(self, limit: int) -> list[Todo]:
        """Claim up to `limit` todos from the queues served now (none yet, with '*': []).

        With several databases, each claim starts at the next one in turn and goes on to the
        others while it finds nothing, so a busy database starves none; one that is down is
        passed over, and DatabaseUnavailable is raised only when every one is.
        """
        databases = self.databases
        start = next(self._turns) % len(databases)
        unavailable: list[faults.DatabaseUnavailable] = []
        for alias in databases[start:] + databases[:start]:
            try:
                todos = self._with_reconnect(
                    "claim", self._claim_from, alias, limit, tries=1, database=alias
                )
            except faults.DatabaseUnavailable as error:
                unavailable.append(error)
                continue
            if todos:
                return todos
        if len(unavailable) == len(databases):
            raise unavailable[0]
        return []

    def _claim_from(self, alias: str, limit: int) -> list[Todo]:
        queues = self.selection.current(alias)
        if not queues:
            return []
        return self._managers[alias].claim_batch(queues, self.owner, self.ttl, limit)

    def _reserve(self, count: int) -> int:
        """Take up to `count` claims from the `max_todos` budget (give back with < 0)."""
        with self._lock:
            if count > 0 and self._stopping.is_set():
                return 0
            if self.max_todos is not None and count > 0:
                count = min(count, self.max_todos - self._reserved)
            self._reserved += count
            return count

    def _execute(self, runner: _Runner, held: _Held) -> None:
        todo = held.todo
        # In `_running` before the stop check: `_abort` releases it, or the check sees the stop.
        self._running[todo.id] = held
        if self._stopping.is_set() or time.monotonic() - held.leased_at > self.ttl / 2:
            # Stopping, or waited so long in the batch that its lease could lapse mid-run.
            self._running.pop(todo.id, None)
            self._release(held)
            return
        started = time.perf_counter()
        held.runner, held.started = runner, time.monotonic()
        try:
            handler = self._handler(todo)
            held.finished = getattr(handler, "finished", None)
            held.timeout = self._timeout(todo)
            value = outcomes.result(handler(todo))
        except BaseException as error:
            if held.timed_out:
                return  # failed at its timeout already; this thread is no longer a runner
            seconds = time.perf_counter() - started
            runner.record(seconds)
            self._running.pop(todo.id, None)
            # Still inside `except`: a `finished` hook (task_finished) logs the traceback.
            self._fail(held, error, seconds)
            return
        if held.timed_out:
            return
        seconds = time.perf_counter() - started
        runner.record(seconds)
        if not runner.acks:
            runner.oldest_ack = time.monotonic()
        runner.acks[todo.id] = (held, value, seconds)

    def _timeout(self, todo: Todo) -> float | None:
        """How long `todo`'s handler may run: its own timeout, else the worker's."""
        if todo.source != handlers.TASKS_SOURCE:
            own = handlers.get_timeout(todo.kind)
            if own is not None:
                return own
        return self.timeout

    def _handler(self, todo: Todo) -> handlers.Handler:
        """The callable that runs `todo`: its kind's handler, or the django.tasks runner."""
        key = f"{todo.source}\x00{todo.kind}"
        found = self._handlers.get(key)
        if found is not None:
            return found
        if todo.source == handlers.TASKS_SOURCE:
            from switchboard_todos.backends import TaskRunner

            found = TaskRunner()
        else:
            registered = handlers.get_handler(todo.kind)
            if registered is None:
                raise UnknownKind(
                    f"No handler for kind {todo.kind!r} in this worker; register one with "
                    f"@handler({todo.kind!r}) in a todo_handlers module."
                )
            found = async_to_sync(registered) if iscoroutinefunction(registered) else registered
        self._handlers[key] = found
        return found

    # Storing outcomes

    def _flush(self, runner: _Runner) -> None:
        """Acknowledge the runner's finished todos with one `complete_many` per database."""
        if not runner.acks:
            return
        acks, runner.acks = runner.acks, {}
        by_database: dict[str, dict[str, tuple[_Held, Any, float]]] = {}
        for todo_id, ack in acks.items():
            by_database.setdefault(_database(ack[0].todo), {})[todo_id] = ack
        for alias, database_acks in by_database.items():
            self._flush_database(runner, alias, database_acks)

    def _flush_database(
        self, runner: _Runner, alias: str, acks: dict[str, tuple[_Held, Any, float]]
    ) -> None:
        """Acknowledge finished todos of database `alias` with one `complete_many`."""
        manager = self._managers[alias]
        results = {
            todo_id: value
            for todo_id, (held, value, _) in acks.items()
            if not held.lost and not held.released
        }
        try:
            stored = set(
                self._with_reconnect(
                    "complete_many", manager.complete_many, self.owner, results, database=alias
                )
            )
        except faults.DatabaseUnavailable:
            # Keep them for the next flush; their leases lapse if the database stays away.
            runner.acks = {**acks, **runner.acks}
            return
        except Exception:
            # The database refused one result, and with it the whole statement: store them
            # one at a time, so that only the todo at fault fails.
            logger.warning(
                "worker %s: a batch acknowledgement was refused", self.owner, exc_info=True
            )
            stored = self._complete_each(runner, alias, acks, results)
        with self._lock:
            self.stats.done += len(stored)
        for todo_id, (held, value, seconds) in acks.items():
            self._running.pop(todo_id, None)
            todo = held.todo
            if todo_id not in stored:
                self._lost(held, seconds)
                continue
            _log(todo, "done", seconds)
            if held.finished is not None:
                todo.state, todo.result, todo.completed_at = State.DONE, value, timezone.now()
            self._finished_hook(held, todo)

    def _complete_each(
        self,
        runner: _Runner,
        alias: str,
        acks: dict[str, tuple[_Held, Any, float]],
        results: dict[str, Any],
    ) -> set[str]:
        """Complete `results` one by one; a refused one fails its todo and leaves `acks`."""
        stored = set()
        complete = self._managers[alias].complete
        for todo_id, value in results.items():
            try:
                self._with_reconnect(
                    "complete", complete, todo_id, self.owner, value, tries=1, database=alias
                )
            except (TodoConflict, TodoNotFound):
                continue  # lost: reported with the others
            except faults.DatabaseUnavailable:
                runner.acks[todo_id] = acks.pop(todo_id)  # the next flush tries again
            except Exception as refusal:
                held, _, seconds = acks.pop(todo_id)
                self._running.pop(todo_id, None)
                self._fail(held, refusal, seconds)
            else:
                stored.add(todo_id)
        return stored

    def _fail(self, held: _Held, error: BaseException, seconds: float) -> None:
        todo = held.todo
        if held.lost or held.released:
            self._lost(held, seconds)
            return
        try:
            stored = self._store_failure(todo, error)
        except (TodoConflict, TodoNotFound):
            self._lost(held, seconds)
            return
        except Exception as refusal:
            # Not even the fixed-shape detail was stored: the lease lapses and the todo runs
            # again, its attempt counted, so that it dead-letters at its cap all the same.
            _log(
                todo,
                f"failed, not stored ({type(refusal).__name__}): it runs again when its "
                "lease lapses",
                seconds,
                error=error,
                level=logging.WARNING,
            )
            return
        dead = stored.state == State.FAILED
        with self._lock:
            self.stats.failed += 1
            self.stats.dead_lettered += dead
        retry = stored.next_retry_at
        _log(
            todo,
            "dead-lettered" if dead else f"failed, retry at {retry:%Y-%m-%d %H:%M:%S%z}",
            seconds,
            error=error,
            level=logging.WARNING if dead else logging.INFO,
        )
        self._finished_hook(held, stored)

    def _store_failure(self, todo: Todo, error: BaseException) -> Todo:
        """Fail `todo` with the error's detail, or a fixed-shape one if that is refused."""
        alias = _database(todo)
        fail = self._managers[alias].fail
        try:
            return self._with_reconnect(
                "fail", fail, todo.id, self.owner, outcomes.error_detail(error), database=alias
            )
        except (TodoConflict, TodoNotFound, faults.DatabaseUnavailable):
            raise
        except Exception as refusal:
            logger.warning("todo %s: its error detail was refused", todo.id, exc_info=True)
            return self._with_reconnect(
                "fail",
                fail,
                todo.id,
                self.owner,
                outcomes.fallback_error(error, refusal),
                database=alias,
            )

    def _finished_hook(self, held: _Held, stored: Todo) -> None:
        """Tell the handler its outcome is stored; its errors are logged, never raised."""
        if held.finished is None:
            return
        try:
            held.finished(stored)
        except Exception:
            logger.exception("todo %s: the finished hook failed", stored.id)

    def _lost(self, held: _Held, seconds: float) -> None:
        if held.released:
            return
        with self._lock:
            self.stats.lost += 1
        _log(held.todo, "lost: the lease went to another worker", seconds, level=logging.WARNING)

    def _release(self, held: _Held) -> None:
        try:
            alias = _database(held.todo)
            self._with_reconnect(
                "release", self._managers[alias].release, held.todo.id, self.owner, database=alias
            )
        except (TodoConflict, TodoNotFound, faults.DatabaseUnavailable):
            return  # done or lost meanwhile, or the lease lapses by itself
        with self._lock:
            self.stats.released += 1
        _log(held.todo, "released", 0.0)

    def _release_batch(self, runner: _Runner) -> None:
        """Give back the todos of a runner's batch that have not started."""
        while True:
            try:
                held = runner.batch.popleft()
            except IndexError:
                return
            self._release(held)

    # Leases and connections

    def _heartbeats(self) -> None:
        """Extend the lease of each running todo when a third of the TTL has passed."""
        every = self.ttl / 3
        try:
            self._beat(every)
        except Exception:
            self._crash("the heartbeat thread")
        finally:
            connections.close_all()

    def _beat(self, every: float) -> None:
        """Every half interval: one `heartbeat_many` for the todos due a beat.

        The statement skips a todo whose row another session holds locked, so one locked row
        costs no other lease; the skipped todo is due again at the next beat.
        """
        while not self._finished.wait(min(every / 2, 1.0)):
            now = time.monotonic()
            due = {
                todo_id: held
                for todo_id, held in list(self._running.items())
                if not held.lost and not held.released and now - held.leased_at >= every
            }
            by_database: dict[str, dict[str, _Held]] = {}
            for todo_id, held in due.items():
                by_database.setdefault(_database(held.todo), {})[todo_id] = held
            for alias, database_due in by_database.items():
                self._beat_database(alias, database_due, now)
            self._watch_handlers()
            self._release_stuck_batches()

    def _beat_database(self, alias: str, due: dict[str, _Held], now: float) -> None:
        """One `heartbeat_many` for the todos of database `alias` due a beat."""
        try:
            beats = self._with_reconnect(
                "heartbeat",
                self._managers[alias].heartbeat_many,
                self.owner,
                self.ttl,
                list(due),
                tries=1,
                database=alias,
            )
        except faults.DatabaseUnavailable:
            return  # the next beat tries again
        for todo_id in beats.extended:
            due[todo_id].leased_at = now
        for todo_id in beats.lost:
            due[todo_id].lost = True
            logger.warning("todo %s: lease lost to another worker", todo_id)
        if skipped := len(due) - len(beats.extended) - len(beats.lost):
            logger.info(
                "worker %s: %d todos locked by another session; their leases are "
                "extended at the next beat",
                self.owner,
                skipped,
            )

    def _watch_handlers(self) -> None:
        """Fail each todo whose handler ran past its timeout; warn of long ones without one."""
        now = time.monotonic()
        for held in list(self._running.values()):
            if held.started is None or held.lost or held.released:
                continue
            ran = now - held.started
            if held.timeout is not None and ran > held.timeout:
                self._time_out(held, ran)
            elif held.timeout is None and not held.warned and ran > HUNG_WARNING_TTLS * self.ttl:
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

    def _time_out(self, held: _Held, ran: float) -> None:
        """Fail a todo whose handler overran, and give its runner's place to a fresh thread.

        The attempt counts, so a todo that always hangs is dead-lettered at its cap. A thread
        cannot be killed: the hung one runs on, its outcome dropped, until its handler
        returns. When more threads hang than the worker has runners, the process exits
        non-zero, the one way to end them, and its supervisor starts a fresh one.
        """
        held.timed_out = True
        self._running.pop(held.todo.id, None)
        error = HandlerTimeout(
            f"The handler ran past its timeout of {held.timeout:g}s and was abandoned (still "
            f"running after {ran:.1f}s)."
        )
        self._fail(held, error, ran)
        held.lost = True
        runner = held.runner
        if runner is None or runner.abandoned:
            return
        runner.abandoned = True
        self._release_batch(runner)
        with self._lock:
            self._abandoned = [r for r in self._abandoned if r.thread and r.thread.is_alive()]
            self._abandoned.append(runner)
            hung = len(self._abandoned)
            fresh = _Runner(runner.index)
            self._runners[self._runners.index(runner)] = fresh
        if hung > self.concurrency:
            logger.error(
                "worker %s: %d handler threads hung past their timeouts; exiting so that the "
                "process is restarted",
                self.owner,
                hung,
            )
            with self._lock:
                self._crashed.append(f"{hung} hung handler threads")
            self._abort()
            return
        if not self._stopping.is_set():
            self._start(fresh)

    def _release_stuck_batches(self) -> None:
        """Release the waiting todos of any batch stuck behind a handler that overran."""
        now = time.monotonic()
        for runner in self._runners:
            try:
                waited = now - runner.batch[0].leased_at
            except IndexError:
                continue
            if waited > UNSTARTED_LIMIT:
                logger.info(
                    "worker %s: releasing %d todos waiting %.1fs behind a slow handler",
                    self.owner,
                    len(runner.batch),
                    waited,
                )
                self._release_batch(runner)

    def _with_reconnect(
        self, what: str, call: Callable[..., T], *args: Any, database: str, tries: int = _DB_TRIES
    ) -> T:
        """Run `call` on `database`; on a fault of it, reconnect and try again, `tries` in all.

        Raises DatabaseUnavailable when the last try fails. Other errors are the statement's
        own and pass through. A retry may repeat a statement that did commit: every one used
        here is guarded by state and owner, so the repeat changes nothing.
        """
        attempt = 0
        while True:
            try:
                result = call(*args)
            except DatabaseError as error:
                if not faults.is_outage(error):
                    raise
                connections[database].close()
                delay = self._outages[database].failed(what, error)
                attempt += 1
                if attempt >= tries:
                    raise faults.DatabaseUnavailable(what, delay) from error
                time.sleep(min(delay, 0.1 * 2**attempt))
            else:
                self._outages[database].passed()
                return result


def _log(
    todo: Todo,
    outcome: str,
    seconds: float,
    *,
    error: BaseException | None = None,
    level: int = logging.INFO,
) -> None:
    if not logger.isEnabledFor(level):
        return
    detail = f" ({type(error).__name__}: {outcomes.message(error)})" if error is not None else ""
    logger.log(
        level,
        "todo %s kind=%s attempt=%d %.3fs %s%s",
        todo.id,
        todo.kind,
        todo.attempt,
        seconds,
        outcome,
        detail,
    )


def _database(todo: Todo) -> str:
    """The database a claimed todo came from, where its outcome goes."""
    return str(todo._state.db)
