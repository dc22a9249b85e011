"""`Worker`: the roles of a worker process composed, its threads started, run and stopped."""

from __future__ import annotations

import os
import secrets
import socket
import threading
from collections.abc import Iterable
from contextlib import ExitStack
from datetime import timedelta

from django.db import connections

from switchboard_todos import faults, handlers, validation
from switchboard_todos.claims.listen import Doorbell, Listener, PollSchedule
from switchboard_todos.claims.selection import QueueSelection
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import WorkerCrashed
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.worker.claiming import DEFAULT_BATCH_SIZE, Claimer
from switchboard_todos.worker.databases import Databases
from switchboard_todos.worker.executing import Executor
from switchboard_todos.worker.hand import Hand, Runner, WorkerStats, logger
from switchboard_todos.worker.heartbeats import Heartbeater
from switchboard_todos.worker.supervisor import Supervisor
from switchboard_todos.worker.watchdog import Watchdog


def default_owner() -> str:
    """A worker id unique to this process: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"


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
        batch_size: int = DEFAULT_BATCH_SIZE,
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
        doorbell = Doorbell(self.queues, capacity=self.concurrency, wants=self.selection.wants)
        self._hand = hand = Hand(self.owner, self.ttl, self.concurrency, doorbell)
        self.stats = hand.stats
        self._listeners: list[Listener] = []
        databases_served = Databases(self.databases, self.owner)
        self._claimer = Claimer(
            hand,
            databases_served,
            self.selection,
            batch_size=self.batch_size,
            max_todos=self.max_todos,
        )
        self._executor = Executor(hand, databases_served, timeout=self.timeout)
        self._heartbeats = Heartbeater(hand, databases_served)
        self._supervisor = Supervisor(
            hand,
            self._executor,
            max_seconds=self.max_seconds,
            shutdown_timeout=self.shutdown_timeout,
        )
        self._watchdog = Watchdog(
            hand, self._executor, start=self._start, abort=self._supervisor.abort
        )

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
        heartbeat = threading.Thread(target=self._beat, name="todo-heartbeat", daemon=True)
        with ExitStack() as stack:
            for alias in self.databases:
                stack.enter_context(faults.timeouts(alias))
            signals = stack.enter_context(Shutdown(every_signal=True))
            self._work(heartbeat, signals)
        logger.info("worker %s stopped: %s", self.owner, self.stats)
        crashed = self._hand.crashed
        if crashed:
            raise WorkerCrashed(
                f"worker {self.owner}: {', '.join(crashed)} crashed (the traceback is "
                "logged above); the todos it held were released or expire with their leases."
            )
        return self.stats

    def _work(self, heartbeat: threading.Thread, signals: Shutdown) -> None:
        hand = self._hand
        try:
            if self.listen:
                for alias in self.databases:
                    listener = Listener(alias)
                    self._listeners.append(listener)
                    listener.subscribe(hand.doorbell)
            heartbeat.start()
            for runner in hand.runners:
                self._start(runner)
            self._supervisor.supervise(signals)
        finally:
            hand.finished.set()
            if heartbeat.is_alive():
                heartbeat.join()
            for listener in self._listeners:
                listener.stop()

    def _start(self, runner: Runner) -> None:
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
        self._hand.stop()

    # The threads

    def _run_runner(self, runner: Runner) -> None:
        """A runner thread: claim a batch, run its todos one after the other, acknowledge."""
        hand, claimer, executor = self._hand, self._claimer, self._executor
        schedule = PollSchedule(self.poll_interval, self._listeners)
        try:
            # An abandoned runner claims no more: its place and its batch went to a fresh one.
            while not hand.stopping.is_set() and not runner.abandoned:
                if not runner.batch:
                    executor.flush(runner)
                    claimed = claimer.claim(runner)
                    if claimed is None:
                        break
                    if not claimed:
                        hand.doorbell.wait(schedule.pause())
                        continue
                    schedule.reset()
                elif claimer.express_due(runner):
                    claimer.express(runner)
                try:
                    held = runner.batch.popleft()
                except IndexError:
                    continue  # taken by the supervisor, which released it
                executor.execute(runner, held)
                if executor.ack_due(runner):
                    executor.flush(runner)
            executor.release_batch(runner)
            executor.flush(runner)
        except Exception:
            self._supervisor.crash(f"runner {runner.index}")
        finally:
            connections.close_all()

    def _beat(self) -> None:
        """The heartbeat thread: every half interval (at most a second), a beat and a watch."""
        hand = self._hand
        try:
            while not hand.finished.wait(min(self._heartbeats.every / 2, 1.0)):
                self._heartbeats.beat()
                self._watchdog.watch()
        except Exception:
            self._supervisor.crash("the heartbeat thread")
        finally:
            connections.close_all()
