"""`manage.py demo_crash`: a worker killed with SIGKILL mid-todo loses nothing (docs/demo.md).

Several `todo_worker` processes and a reaper run with a short lease. A few slow todos are
enqueued, and the first worker seen running one is killed with SIGKILL. A timeline follows,
read from the todos table: the killed worker's lease expires, since nobody renews it; the
reaper requeues the todo (or a worker's claim takes the expired lease first); another worker
completes it. The summary shows every todo done, its attempts, and who finished it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.db.models import OuterRef, Subquery
from django.db.models.functions import Now

from devtools.processes import Child, Children, Console, database_in_words
from switchboard_todos.models import ErrorEntry, State, Todo
from switchboard_todos.shutdown import Shutdown

QUEUE = "crash-demo"
#: The type of a todo's last failure history entry ("LeaseExpired": the reaper took it back).
LAST_ERROR = Subquery(
    ErrorEntry.objects.filter(todo=OuterRef("pk")).order_by("-id").values("entry__error__type")[:1]
)
KIND = "example.slow"
#: How long the run may take before it is called a failure.
DEADLINE = 120.0
#: How often the timeline looks at the todos.
POLL = 0.1
#: How long the workers may take to start.
START_TIMEOUT = 60.0


@dataclass
class Seen:
    """What the timeline last saw of one todo."""

    state: str
    owner: str | None
    attempt: int


@dataclass
class Victim:
    """The killed worker, the todo it held, and when (monotonic) that todo's lease expires."""

    worker: Child
    owner: str
    todo_id: str
    expires_at: float
    expiry_noted: bool = False


def short(todo_id: str) -> str:
    """The id as the timeline shows it: enough to tell a handful of todos apart."""
    return todo_id[:11]


class CrashDemo:
    """One run: `run()` returns True when every todo was done and the children stopped."""

    def __init__(
        self, console: Console, *, workers: int, todos: int, seconds: float, ttl: float
    ) -> None:
        self.console = console
        self.workers = workers
        self.todos = todos
        self.seconds = seconds
        self.ttl = ttl
        # Unique per run, so that two runs at once never share an owner.
        self.names = {
            f"demo_crash:{os.getpid()}:worker-{n}": f"worker-{n}" for n in range(1, 1 + workers)
        }
        self.kill_after = min(0.5, seconds / 4)
        self.started = time.monotonic()
        self.seen: dict[str, Seen] = {}
        self.victim: Victim | None = None
        self._holding_since: dict[str, float] = {}

    def say(self, text: str = "") -> None:
        self.console.say("demo", text)

    def note(self, text: str, at: float | None = None) -> None:
        """A line of the timeline, with the seconds since the todos were enqueued."""
        self.say(f"{(time.monotonic() if at is None else at) - self.started:6.2f}s  {text}")

    def name(self, owner: str | None) -> str:
        return self.names.get(owner or "", owner or "nobody")

    def run(self) -> bool:
        interrupts = Shutdown(every_signal=True)
        with interrupts:
            self.say(f"database: {database_in_words()}")
            self.say(
                f"{self.workers} workers with a {self.ttl:g} s lease, heartbeating every "
                f"{self.ttl / 3:g} s; the reaper sweeps every second"
            )
            # The timeline needs the workers' start lines, which they log at INFO.
            env = {**os.environ, "LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"}
            children = Children(self.console, env)
            try:
                finished = self.start_and_watch(children, interrupts)
            finally:
                stopped = children.stop(interrupts)
        self.say("stopped: nothing is left running" if stopped else "stopped, not cleanly")
        return finished and stopped

    def start_and_watch(self, children: Children, interrupts: Shutdown) -> bool:
        workers = {
            owner: children.start(
                name, "todo_worker", "--queue", QUEUE, "--ttl", f"{self.ttl:g}", "--owner", owner
            )
            for owner, name in self.names.items()
        }
        children.start("reaper", "reap_todos", "--loop", "--interval", "1")
        for owner, worker in workers.items():
            if not worker.expect(f"worker {owner}: queues", START_TIMEOUT) or interrupts.count:
                self.say(f"{worker.name} did not start")
                return False
        created = Todo.objects.create_many(
            {
                "queue": QUEUE,
                "kind": KIND,
                "title": f"slow todo {number} of {self.todos}",
                "payload": {"seconds": self.seconds},
            }
            for number in range(1, self.todos + 1)
        )
        self.started = time.monotonic()
        self.seen = {todo.id: Seen(todo.state, None, 0) for todo, _ in created}
        self.note(f"enqueued {self.todos} todos of {self.seconds:g} s each on queue {QUEUE!r}")
        while not interrupts.wait(POLL):
            if time.monotonic() - self.started > DEADLINE:
                self.say(f"not every todo was done within {DEADLINE:g} s")
                return False
            ended = [
                child
                for child in children.ended()
                if self.victim is None or child is not self.victim.worker
            ]
            if ended:
                self.say(f"{ended[0].name} ended (status {ended[0].returncode}) unexpectedly")
                return False
            if self.look(workers):
                return self.summarise()
        self.say("interrupted")
        return False

    def look(self, workers: dict[str, Child]) -> bool:
        """Note what changed since the last look, kill the victim when due; True once all done."""
        rows = (
            Todo.objects.filter(id__in=self.seen)
            .annotate(now=Now(), last_error=LAST_ERROR)
            .values("id", "state", "owner", "attempt", "lease_expires_at", "last_error", "now")
        )
        for row in sorted(rows, key=lambda row: row["id"]):
            self.change(row)
            if self.victim is None and row["state"] == State.CLAIMED:
                self.maybe_kill(row, workers)
        return all(seen.state in (State.DONE, State.FAILED) for seen in self.seen.values())

    def change(self, row: Mapping[str, Any]) -> None:
        todo, seen = short(row["id"]), self.seen[row["id"]]
        state, owner, attempt = row["state"], row["owner"], row["attempt"]
        self.note_expiry(row)
        if (state, owner, attempt) == (seen.state, seen.owner, seen.attempt):
            return
        who = self.name(owner)
        if state == State.CLAIMED and seen.state == State.CLAIMED:
            self.note(
                f"{who} claimed {todo} (attempt {attempt}): its claim took the expired lease of "
                f"{self.name(seen.owner)}"
            )
        elif state == State.CLAIMED:
            self.note(f"{who} claimed {todo} (attempt {attempt})")
        elif state == State.PENDING and seen.state == State.CLAIMED:
            expired = row["last_error"] == "LeaseExpired"
            how = "the reaper requeued" if expired else "released"
            self.note(f"{how} {todo}: attempt {seen.attempt} of {self.name(seen.owner)} is over")
        elif state == State.DONE:
            self.note(f"{who} completed {todo} on attempt {attempt}")
        elif state == State.FAILED:
            self.note(f"{todo} was dead-lettered after {attempt} attempts")
        self.seen[row["id"]] = Seen(state, owner, attempt)

    def note_expiry(self, row: Mapping[str, Any]) -> None:
        """Say that the killed worker's lease expired, once it has or it is seen taken from it."""
        victim = self.victim
        if victim is None or victim.todo_id != row["id"] or victim.expiry_noted:
            return
        if row["owner"] == victim.owner and row["now"] < row["lease_expires_at"]:
            return
        victim.expiry_noted = True
        at = min(victim.expires_at, time.monotonic())
        self.note(f"the lease of {short(row['id'])} lapsed: nobody renewed it", at)

    def maybe_kill(self, row: Mapping[str, Any], workers: dict[str, Child]) -> None:
        """SIGKILL the first worker seen holding a todo, once it has run it a moment."""
        owner = row["owner"]
        since = self._holding_since.setdefault(row["id"], time.monotonic())
        if owner not in workers or time.monotonic() - since < self.kill_after:
            return
        worker = workers[owner]
        worker.kill()
        left = (row["lease_expires_at"] - row["now"]).total_seconds()
        self.victim = Victim(worker, owner, row["id"], time.monotonic() + left)
        self.note(
            f"SIGKILL {worker.name} (pid {worker.pid}) while it runs {short(row['id'])}; its "
            f"lease ends in {left:.1f} s unless renewed, and nobody will renew it"
        )

    def summarise(self) -> bool:
        """Say what became of each todo; True when every one was done."""
        todos = Todo.objects.filter(id__in=self.seen).order_by("id")
        done = sum(todo.state == State.DONE for todo in todos)
        self.say()
        lost = len(self.seen) - done
        self.say(
            f"summary: {done} of {len(self.seen)} todos done, "
            + ("nothing lost" if not lost else f"{lost} NOT done")
        )
        for todo in todos:
            history = "; ".join(
                f"attempt {entry['attempt']} by {self.name(entry['owner'])}: "
                f"{entry['error'].get('type', '?')}"
                for entry in todo.errors
            )
            self.say(
                f"  {short(todo.id)}  {todo.state:<7} attempts {todo.attempt}  finished by "
                f"{self.name(todo.owner)}" + (f"  ({history})" if history else "")
            )
        self.say()
        return not lost
