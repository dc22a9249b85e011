"""The one service layer of the remote surfaces: every verb a remote agent may call.

HTTP and MCP adapters authenticate the caller, pass its Agent and the request's arguments
here, and turn what comes back or is raised into their protocol (errors.py). Permissions are
checked here and nowhere else:

* the owner of every transition is the agent's name, never a value from the request;
* an agent claims from and lists only the queues it was granted (`claim_queues`), and creates
  todos only in `create_queues`: asking for another queue raises QueueNotGranted;
* it sees the todos of its claim queues not assigned to another agent, and the todos it
  holds; any other todo answers exactly as an unknown id does (TodoNotFound), so that an
  agent cannot learn what other queues hold.

One module per family of verbs: `identity` (authenticate, and recognise for the verbs whose
statement checks the credential itself), `reading` (list and get), `claiming`, `holding`
(heartbeat, complete, fail, release), `creating` (a todo, a plan) and `tasks` (MCP tasks: the
todos an agent created, followed by a task id of its own);
beside them `visibility` (what an agent may see, and in which databases), `quotas` (held todos,
creations and bytes of JSON a minute, attempts) and `twins`. Every verb has an `a`-prefixed
async twin; `aclaim` and `aget_todo` wait on the LISTEN path holding neither a thread nor a
connection, each a long poll counted against the agent's cap (long_poll_cap.py). A surface
makes its answer to `aclaim` within `handing_over`, which gives the todos back if that answer
cannot reach the client.
"""

from __future__ import annotations

from switchboard_todos.agents.long_poll_cap import MAX_WAIT
from switchboard_todos.agents.service.claiming import (
    MAX_CLAIM_LIMIT,
    aclaim,
    claim,
    handing_over,
)
from switchboard_todos.agents.service.creating import (
    MAX_PLAN,
    acreate_for,
    acreate_many_for,
    create_for,
    create_many_for,
)
from switchboard_todos.agents.service.holding import (
    acomplete,
    afail,
    aheartbeat,
    arelease,
    complete,
    fail,
    heartbeat,
    release,
)
from switchboard_todos.agents.service.identity import (
    aauthenticate,
    arecognise,
    authenticate,
    check_shape,
    recognise,
    recognised,
)
from switchboard_todos.agents.service.quotas import HELD_RETRY_MAX
from switchboard_todos.agents.service.reading import (
    CURSOR_PATTERN,
    DEFAULT_PAGE,
    MAX_PAGE,
    Page,
    aget_todo,
    alist_todos,
    get_todo,
    list_todos,
)
from switchboard_todos.agents.service.tasks import (
    TASK_PAGE,
    AgentTask,
    TaskPage,
    acancel_task,
    aget_task,
    alist_tasks,
    astart_task,
    await_task,
    cancel_task,
    check_merging_plan,
    get_task,
    list_tasks,
    start_task,
    ttl_ms,
)

__all__ = [
    "TASK_PAGE",
    "AgentTask",
    "TaskPage",
    "acancel_task",
    "aget_task",
    "alist_tasks",
    "astart_task",
    "await_task",
    "cancel_task",
    "check_merging_plan",
    "get_task",
    "list_tasks",
    "start_task",
    "ttl_ms",
    "CURSOR_PATTERN",
    "DEFAULT_PAGE",
    "HELD_RETRY_MAX",
    "MAX_CLAIM_LIMIT",
    "MAX_PAGE",
    "MAX_PLAN",
    "MAX_WAIT",
    "Page",
    "aauthenticate",
    "arecognise",
    "aclaim",
    "acomplete",
    "acreate_for",
    "acreate_many_for",
    "afail",
    "aget_todo",
    "aheartbeat",
    "alist_todos",
    "arelease",
    "authenticate",
    "check_shape",
    "claim",
    "complete",
    "create_for",
    "create_many_for",
    "fail",
    "get_todo",
    "handing_over",
    "heartbeat",
    "list_todos",
    "recognise",
    "recognised",
    "release",
]
