"""The todo worker: claim in batches, run handlers on threads, heartbeat, acknowledge in batches.

`Worker(queues, ...).run()` runs until stopped (SIGTERM/SIGINT, `stop()`, `max_todos`,
`max_seconds`); `manage.py todo_worker` is a thin command around it. One module per role,
along the lines of Oban's producer, executor and watchman and River's producer and completer;
`Worker` (worker.py) composes them and owns the threads:

* `claiming`: each of the `concurrency` runner threads claims its own batches with
  `claim_batch`, sized to the runner's pace (`Claimer`);
* `executing`: a runner runs its batch one todo after the other, and acknowledges the
  successes with one `complete_many` per batch; a failure is stored at once with `fail`
  (`Executor`);
* `heartbeats`: one thread extends the leases of the running todos with their handlers'
  progress notes, and learns which ones an operator cancelled (`Heartbeater`); at each beat
  it runs the watchdog;
* `watchdog`: the handlers the worker stops waiting for (past their timeouts, or cancelled),
  and the batches stuck behind slow ones (`Watchdog`);
* `supervisor`: the calling thread watches for signals, `max_seconds` and the shutdown
  timeout, and stops or aborts; a thread that crashes stops the worker (`Supervisor`);
* `hand`: what they share (the todos in hand, the runners, the counts), and `databases`:
  every statement run through the faults of its database.

One listener thread (`listen.Listener`) wakes idle runners when a todo is enqueued in one of
their queues; they also poll, as some todos become claimable without a notification.

Faults of the database (a terminated backend, a restarting or frozen server, a failover that
leaves it read-only: `faults`) close that thread's connection, and the worker backs off until
the database is back, logging one line when the fault begins and one when it ends. A claim
whose answer was lost expires after the TTL and is claimed again, an acknowledgement is
retried: no todo is lost, though one may run twice.
"""

from __future__ import annotations

from switchboard_todos.worker.hand import WorkerStats
from switchboard_todos.worker.worker import Worker, default_owner

__all__ = ["Worker", "WorkerStats", "default_owner"]
