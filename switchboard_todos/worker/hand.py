"""What the worker's roles share: the todos in hand, the runners, the stop flags, the counts."""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from switchboard_todos import handlers, outcomes
from switchboard_todos.claims.listen import Doorbell
from switchboard_todos.models import Todo

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer

#: The one logger of every role (docs/worker.md names it).
logger = logging.getLogger("switchboard_todos.worker")


@dataclass
class WorkerStats:
    """What a worker did, returned by `run()`."""

    claimed: int = 0
    done: int = 0
    failed: int = 0
    dead_lettered: int = 0
    released: int = 0
    lost: int = 0
    cancelled: int = 0
    #: Express claims that found a todo (worker/claiming.py): fair keys' todos that overtook
    #: a batch in hand, or the next in turn.
    expressed: int = 0


class Held:
    """A todo this worker claimed: waiting in a runner's batch, running, or awaiting its ack."""

    __slots__ = (
        "todo", "leased_at", "finished", "lost", "released", "runner", "started", "returned",
        "timeout", "dropped", "warned", "running", "tracer",
    )  # fmt: skip

    def __init__(self, todo: Todo, leased_at: float, tracer: Tracer | None = None) -> None:
        self.todo = todo
        self.leased_at = leased_at  # monotonic time the lease was last set (claim, heartbeat)
        #: What makes its handler run's span (tracing.tracer(), asked once per batch): None,
        #: untraced.
        self.tracer = tracer
        self.finished: Callable[[Todo], None] | None = None
        self.lost = False
        self.released = False
        self.runner: Runner | None = None  # the runner whose thread runs its handler
        self.started: float | None = None  # monotonic time its handler started
        self.returned = False  # its handler returned or raised
        self.timeout: float | None = None
        # The worker stopped waiting for its handler (past its timeout, or cancelled), whose
        # thread runs on, no longer a runner; whatever the handler ends with is dropped.
        self.dropped = False
        self.warned = False  # logged as possibly hung
        #: What its handler can ask: cancelled? And what it reports: its progress.
        self.running = handlers.Running(todo.id)


class Runner:
    """One runner thread's state: its batch, its unacknowledged successes, its pace."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.thread: threading.Thread | None = None
        self.abandoned = False  # its handler overran or was cancelled; a fresh runner took over
        self.batch: deque[Held] = deque()
        self.acks: dict[str, tuple[Held, Any, float]] = {}
        self.oldest_ack = 0.0
        self.average: float | None = None  # seconds per todo, moving average
        #: Its batch holds todos of fair keys: new work may overtake it (Claimer.express).
        self.keyed = False

    def record(self, seconds: float) -> None:
        self.average = seconds if self.average is None else 0.8 * self.average + 0.2 * seconds


class Hand:
    """The state every role of one worker reads and changes, and the lock that guards it."""

    def __init__(self, owner: str, ttl: float, concurrency: int, doorbell: Doorbell) -> None:
        self.owner = owner
        self.ttl = ttl
        self.concurrency = concurrency
        self.doorbell = doorbell
        self.lock = threading.Lock()
        self.stats = WorkerStats()
        #: The todos whose handlers run, or ran and await their acknowledgement, by id.
        self.running: dict[str, Held] = {}
        self.runners = [Runner(index) for index in range(concurrency)]
        #: Runners whose handlers hung past their timeouts, replaced by fresh ones.
        self.abandoned: list[Runner] = []
        self.stopping = threading.Event()
        self.finished = threading.Event()
        #: The worker threads that died of a bug: `run()` raises WorkerCrashed at the end.
        self.crashed: list[str] = []

    def stop(self) -> None:
        """Stop claiming and let the todos in hand finish; safe from any thread."""
        self.stopping.set()
        self.doorbell.ring_all()


def log(
    todo: Todo,
    outcome: str,
    seconds: float,
    *,
    error: BaseException | None = None,
    level: int = logging.INFO,
) -> None:
    """Log one line for a todo's outcome."""
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


def database_of(todo: Todo) -> str:
    """The database a claimed todo came from, where its outcome goes."""
    return str(todo._state.db)
