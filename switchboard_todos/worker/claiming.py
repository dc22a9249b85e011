"""Claiming: each runner's next batch, sized to its pace, within the `max_todos` budget; and the
express claim, which lets a newly arrived fair key's todo overtake a batch in hand."""

from __future__ import annotations

import itertools
import time

from switchboard_todos import faults, tracing
from switchboard_todos.claims.selection import QueueSelection
from switchboard_todos.models import Todo
from switchboard_todos.worker.databases import Databases
from switchboard_todos.worker.hand import Hand, Held, Runner

#: The claim-to-start delay a batch may add to its last todo, in seconds (and at most TTL/10).
PREFETCH_WINDOW = 0.2
#: The most todos a runner claims at once (`Worker(batch_size=)`): reached only by handlers
#: quicker than PREFETCH_WINDOW / 400 (0.5 ms). Each claim and acknowledgement has a cost of
#: its own, which 400 todos share (docs/benchmarks.md: 100 left 0.77 of the raw loop at 8
#: processes, 400 gave 0.97; 1000 gave 0.82, its batches too big for the drain's end).
DEFAULT_BATCH_SIZE = 400
#: At least this many seconds between the claims of one worker process that an express claim
#: adds: its cost (one small claim) is bounded to 1/EXPRESS_GAP statements a second per
#: process, however fast todos arrive. 5 ms did no better than 10 in the fair_queue scenario
#: (docs/benchmarks.md, scenario 14) and cost the backlog's drain more.
EXPRESS_GAP = 0.01
#: The todos an express claim takes: a key that was idle takes its turn level with the head of
#: the queue (sql/shared.sql, fair_turn), behind the head's own todo, and a few more keys may
#: have come meanwhile.
EXPRESS_SIZE = 4


class Claimer:
    """Claims batches for the runners, from the queues and databases the worker serves.

    A batch is sized so that its last todo starts within PREFETCH_WINDOW of the claim: quick
    handlers get batches of up to `batch_size`, slow ones a single todo, so a worker never
    sits on todos another worker could be running.

    Fair keys take turns in the claim (sql/claiming.sql), but a todo that arrives while every
    runner works through its batch waits for the next claim, up to a whole batch's run. So a
    runner whose batch holds todos of fair keys, told of new work since this process last
    claimed, first claims EXPRESS_SIZE todos more and runs them next (`express`): the new keys'
    todos, whose turns are at the head, or the next ones in turn if another worker took them.
    At most one such claim per EXPRESS_GAP per process; a queue without fair keys never pays
    for it, since there a new todo is last in line anyway.
    """

    def __init__(
        self,
        hand: Hand,
        databases: Databases,
        selection: QueueSelection,
        *,
        batch_size: int,
        max_todos: int | None,
    ) -> None:
        self.hand = hand
        self.databases = databases
        self.selection = selection
        self.batch_size = batch_size
        self.max_todos = max_todos
        self._prefetch_window = min(PREFETCH_WINDOW, hand.ttl / 10)
        self._turns = itertools.count()
        self._reserved = 0
        #: Monotonic time of this process's last claim: what `express_due` compares with.
        self._claimed_at = 0.0

    def claim(self, runner: Runner) -> list[Todo] | None:
        """Claim the runner's next batch; None when `max_todos` is used up."""
        hand = self.hand
        wanted = self.batch_size
        if runner.average is not None:
            wanted = min(wanted, max(1, int(self._prefetch_window / max(runner.average, 1e-6))))
        else:
            wanted = 1
        limit = self._reserve(wanted)
        if not limit:
            return None
        try:
            todos = self._take(runner, limit)
        except faults.DatabaseUnavailable as unavailable:
            hand.stopping.wait(unavailable.delay)
            return []
        runner.keyed = any(todo.fair_key is not None for todo in todos)
        if todos and len(todos) == limit and hand.concurrency > 1:
            hand.doorbell.ring()  # there may be more: wake an idle runner
        return todos

    def express_due(self, runner: Runner) -> bool:
        """Whether the runner, its batch of fair keys in hand, should claim a few todos first: new
        work was notified since this process last claimed, at least EXPRESS_GAP ago."""
        return (
            runner.keyed
            and self.hand.doorbell.news > self._claimed_at
            and time.monotonic() - self._claimed_at >= EXPRESS_GAP
        )

    def express(self, runner: Runner) -> None:
        """Claim EXPRESS_SIZE todos and put them first in the runner's batch (the class says
        why). A database that is away is left to the next batch's claim, which waits for it."""
        limit = self._reserve(EXPRESS_SIZE)
        if not limit:
            return
        try:
            claimed = self._take(runner, limit, first=True)
        except faults.DatabaseUnavailable:
            return
        if claimed:
            with self.hand.lock:
                self.hand.stats.expressed += 1

    def _take(self, runner: Runner, limit: int, *, first: bool = False) -> list[Todo]:
        """Claim up to `limit` reserved todos into the runner's batch, at its end or `first`;
        the reservations not used go back to the budget, as all do when the database is away
        (DatabaseUnavailable is raised)."""
        hand = self.hand
        leased_at = self._claimed_at = time.monotonic()
        try:
            todos = self._claim_batch(limit)
        except faults.DatabaseUnavailable:
            self._reserve(-limit)
            raise
        if len(todos) < limit:
            self._reserve(len(todos) - limit)
        if self.max_todos is not None and self._reserved >= self.max_todos:
            hand.doorbell.ring_all()  # the budget is spent: idle runners can go
        if todos:
            with hand.lock:
                hand.stats.claimed += len(todos)
            traced = tracing.tracer()  # once per batch: its handler runs' spans, or None
            held = [Held(todo, leased_at, traced) for todo in todos]
            if first:
                runner.batch.extendleft(reversed(held))
            else:
                runner.batch.extend(held)
        return todos

    def _claim_batch(self, limit: int) -> list[Todo]:
        """Claim up to `limit` todos from the queues served now (none yet, with '*': []).

        With several databases, each claim starts at the next one in turn and goes on to the
        others while it finds nothing, so a busy database starves none; one that is down is
        passed over, and DatabaseUnavailable is raised only when every one is.
        """
        databases = self.databases.aliases
        start = next(self._turns) % len(databases)
        unavailable: list[faults.DatabaseUnavailable] = []
        for alias in databases[start:] + databases[:start]:
            try:
                todos = self.databases.run(
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
        return self.databases.managers[alias].claim_batch(
            queues, self.hand.owner, self.hand.ttl, limit
        )

    def _reserve(self, count: int) -> int:
        """Take up to `count` claims from the `max_todos` budget (give back with < 0)."""
        hand = self.hand
        with hand.lock:
            if count > 0 and hand.stopping.is_set():
                return 0
            if self.max_todos is not None and count > 0:
                count = min(count, self.max_todos - self._reserved)
            self._reserved += count
            return count
