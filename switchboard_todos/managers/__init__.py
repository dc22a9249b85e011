"""`Todo.objects`: the public API, one method per transition of the todo state machine.

`TodoManager` is built from one family a module, each readable on its own:

* `creating`: create_todo, create_many (and graphs), enqueue_many, tick_schedule;
* `claiming`: claim_next, claim_batch and their long polls, claim_filtered, claim;
* `holding`: what a lease's holder does (heartbeat, complete, fail, release), and wait_for;
* `operating`: the reaper's sweep and the operator's repairs, one todo or many;
* `machinery` and `rows`, under them all: run a statement, build its Todos, say why a guard
  matched no row.
"""

from __future__ import annotations

from switchboard_todos.managers.claiming import Claiming
from switchboard_todos.managers.creating import Creating
from switchboard_todos.managers.holding import Heartbeats, Holding, Receipt
from switchboard_todos.managers.machinery import KEY_RACE_TRIES, RACED_INDEXES, run_now
from switchboard_todos.managers.operating import BatchResult, Operating, ReapResult, RepairResult

__all__ = [
    "KEY_RACE_TRIES",
    "RACED_INDEXES",
    "BatchResult",
    "Heartbeats",
    "ReapResult",
    "Receipt",
    "RepairResult",
    "TodoManager",
    "run_now",
]


class TodoManager(Creating, Claiming, Holding, Operating):
    """`Todo.objects`: the queries Django gives every model, plus the queue's transitions."""
