"""The one error table of the remote surfaces: what each typed exception means to an agent.

Every adapter maps from here (HTTP to a status and an RFC 9457 problem, MCP to a tool error
with the same title and message) and passes the exception's own message on as the detail,
never re-phrasing what the core said.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from switchboard_todos.exceptions import (
    InvalidPlan,
    InvalidTodo,
    NotAuthenticated,
    QueueNotGranted,
    Throttled,
    TodoCancelled,
    TodoConflict,
    TodoError,
    TodoNotFound,
)

#: Problem types are anchors of the error table in docs/agents.md.
TYPE_BASE = "https://github.com/switchboard/switchboard-todos/blob/main/docs/agents.md#"


class ErrorKind(NamedTuple):
    """How the remote surfaces present one kind of error."""

    status: int
    slug: str
    title: str
    advice: str
    """What an agent should do about it: the MCP tools' descriptions repeat this."""
    sqs: str = "InvalidParameterValue"
    """The error code the SQS endpoint answers with (sqs/views.py)."""

    @property
    def type(self) -> str:
        """The RFC 9457 problem type URI."""
        return TYPE_BASE + self.slug


NOT_AUTHENTICATED = ErrorKind(
    401,
    "not-authenticated",
    "Not authenticated",
    "Stop: the token is missing, unknown or revoked.",
    "InvalidClientTokenId",
)
QUEUE_NOT_GRANTED = ErrorKind(
    403,
    "queue-not-granted",
    "Queue not granted",
    "Use only the queues this agent was granted.",
    "AccessDenied",
)
TODO_NOT_FOUND = ErrorKind(
    404,
    "todo-not-found",
    "Todo not found",
    "Forget this id: no todo of yours has it.",
    "ReceiptHandleIsInvalid",
)
TODO_CONFLICT = ErrorKind(
    409,
    "todo-conflict",
    "Conflict",
    "The todo is not in a state that allows this, or not held by you (the lease was lost): "
    "stop working on it, do not complete it.",
    "ReceiptHandleIsInvalid",
)
TODO_CANCELLED = ErrorKind(
    409,
    "todo-cancelled",
    "Cancelled",
    "An operator cancelled this todo: stop work on it now and do not complete it.",
    "MessageNotInflight",
)
THROTTLED = ErrorKind(
    429,
    "throttled",
    "Too many requests",
    "Wait the seconds the answer gives (Retry-After) before trying again; nothing changed.",
    "RequestThrottled",
)
INVALID_INPUT = ErrorKind(
    422, "invalid-input", "Invalid input", "Fix the arguments as the detail says; nothing changed."
)
#: A plan (create_many_for) whose todos are each well formed but wait for each other in a way
#: that can never run: a conflict between the parts of the request, which no schema states.
INVALID_PLAN = ErrorKind(
    409,
    "invalid-plan",
    "The plan cannot run",
    "The todos of the plan wait for each other in a way that can never run (a ref named twice, "
    "a todo waiting for itself, a cycle): fix the plan; nothing was created.",
)
#: HTTP only: the request body is larger than the API accepts.
BODY_TOO_LARGE = ErrorKind(
    413, "body-too-large", "Request body too large", "Send less; nothing changed."
)
#: HTTP only: a path the API does not have.
ROUTE_NOT_FOUND = ErrorKind(404, "route-not-found", "No such route", "Check the method and path.")
#: HTTP only: a method the path does not take (its answer says which it takes: Allow).
METHOD_NOT_ALLOWED = ErrorKind(
    405, "method-not-allowed", "Method not allowed", "Use a method the Allow header lists."
)
#: Faults of the server, not of the agent (HTTP only; logged, never with a traceback).
UNAVAILABLE = ErrorKind(
    503, "unavailable", "Service unavailable", "Retry after a pause.", "ServiceUnavailable"
)
SERVER_ERROR = ErrorKind(
    500, "server-error", "Internal error", "Retry after a pause.", "InternalFailure"
)

#: What an agent that sent no bearer token is told, by every surface.
NO_TOKEN = "No token: send the header Authorization: Bearer <token>."

#: Exception class -> kind; a subclass takes its nearest listed base's kind.
TABLE: dict[type[TodoError], ErrorKind] = {
    NotAuthenticated: NOT_AUTHENTICATED,
    QueueNotGranted: QUEUE_NOT_GRANTED,
    TodoNotFound: TODO_NOT_FOUND,
    TodoCancelled: TODO_CANCELLED,
    TodoConflict: TODO_CONFLICT,
    Throttled: THROTTLED,
    InvalidPlan: INVALID_PLAN,
    InvalidTodo: INVALID_INPUT,
}


def kind_of(error: TodoError) -> ErrorKind:
    """The kind of `error`; any other TodoError is the agent's input the core refused."""
    for cls in type(error).__mro__:
        kind = TABLE.get(cls)
        if kind is not None:
            return kind
    return INVALID_INPUT


def problem(kind: ErrorKind, detail: str) -> dict[str, Any]:
    """An RFC 9457 problem details object."""
    return {"type": kind.type, "title": kind.title, "status": kind.status, "detail": detail}
