"""The request and response bodies, as pydantic models, and the constraints the schema states.

Request models are strict (a number is not a string, a bool is not an int) and refuse fields
they do not know, so that a misspelt or forbidden field (an `owner`, say: it comes from the
token) is an error, not silently ignored.

The OpenAPI document states every constraint the server holds a request to, so that a client
generated from it cannot build a request the server refuses (tests/test_api_schema.py runs
Schemathesis over it). Numbers are bounded here, by pydantic, exactly as the schema says. Text
is checked by the core (validation/), whose messages HTTP and MCP share; the schema states the
same rules as patterns built from the core's own constants.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_type_hints

from ninja import Schema
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model

from switchboard_todos import graphs, validation
from switchboard_todos.agents import serialize
from switchboard_todos.agents.service import CURSOR_PATTERN, MAX_CLAIM_LIMIT, MAX_PLAN, MAX_WAIT

#: The JSON value a payload, result or error may be (components/schemas, api/views.py).
JSON_VALUE = "JSONValue"
JSON_OBJECT = "JSONObject"
_NO_NUL = r"^[^\x00]*$"


def _reference(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


#: PostgreSQL stores no NUL character, in a key or a value, at any depth (validation.json_text).
JSON_SCHEMAS: dict[str, dict[str, Any]] = {
    JSON_VALUE: {
        "description": "Any JSON value without a NUL character in its strings or keys.",
        "type": ["null", "boolean", "number", "string", "array", "object"],
        "pattern": _NO_NUL,
        "items": _reference(JSON_VALUE),
        "propertyNames": {"pattern": _NO_NUL},
        "additionalProperties": _reference(JSON_VALUE),
    },
    JSON_OBJECT: {
        "description": "A JSON object without a NUL character in its strings or keys.",
        "type": "object",
        "propertyNames": {"pattern": _NO_NUL},
        "additionalProperties": _reference(JSON_VALUE),
    },
}


def text(
    max_length: int | None, *, blank: bool = True, without: str = r"\x00", **extra: Any
) -> WithJsonSchema:
    """The schema of a text the core takes (validation.text): at most `max_length` characters,
    none in the pattern class `without` (NUL, which PostgreSQL cannot store, at least), and
    unless `blank`, one that is not whitespace."""
    schema: dict[str, Any] = {"type": "string", **extra}
    if max_length is not None:
        schema["maxLength"] = max_length
    whitespace = validation.WHITESPACE
    schema["pattern"] = (
        f"^[^{without}]*$" if blank else f"^[^{without}]*[^{without}{whitespace}][^{without}]*$"
    )
    return WithJsonSchema(schema)


#: What `json_value` leaves for AgentsAPI to replace with a reference (pydantic would try to
#: resolve a reference it did not make).
REFERENCE = "x-switchboard-schema"


def json_value(name: str) -> WithJsonSchema:
    """The schema of a JSON value the core takes (JSON_SCHEMAS)."""
    return WithJsonSchema({REFERENCE: name})


def with_references(node: Any) -> Any:
    """`node` with each place `json_value` marked made a reference to its schema."""
    if isinstance(node, dict):
        if REFERENCE in node:
            return _reference(node[REFERENCE])
        return {key: with_references(value) for key, value in node.items()}
    if isinstance(node, list):
        return [with_references(item) for item in node]
    return node


QueueName = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": validation.QUEUE_MAX_LENGTH,
            "pattern": validation.QUEUE_PATTERN,
        }
    ),
]
#: A todo's id: any text another service may have given it, but a slash, which ends the path.
TodoId = Annotated[str, text(validation.TODO_ID_MAX_LENGTH, blank=False, without=r"\x00/")]
Cursor = Annotated[str, WithJsonSchema({"type": "string", "pattern": CURSOR_PATTERN})]
Key = Annotated[str, text(validation.IDEMPOTENCY_KEY_MAX_LENGTH, blank=False)]
#: An agent's name: one line (validation.identifier).
Name = Annotated[str, text(validation.OWNER_MAX_LENGTH, blank=False, without=r"\x00-\x1f\x7f")]
Kind = Annotated[
    str,
    WithJsonSchema(
        {
            "type": "string",
            "maxLength": validation.KIND_MAX_LENGTH,
            "pattern": f"^[^\\x00{validation.WHITESPACE}]*$",
        }
    ),
]
Title = Annotated[str, text(validation.TITLE_MAX_LENGTH)]
#: The name a todo of a plan goes by in the others' `after` (graphs.py).
Ref = Annotated[str, text(graphs.REF_MAX_LENGTH, blank=False)]
#: An entry of a plan's `after`: the ref of a todo of the plan, or the id of an existing todo.
RefOrId = Annotated[str, text(validation.TODO_ID_MAX_LENGTH, blank=False)]
Moment = Annotated[str, WithJsonSchema({"type": "string", "format": "date-time"})]


def _integral(value: Any) -> Any:
    """A number JSON Schema calls an integer (2.0 is one) as an int; anything else as it is,
    for the strict int to refuse."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


#: An integer as JSON Schema's `integer` means it: 2.0 is one, "2" and true are not.
Integer = Annotated[int, BeforeValidator(_integral)]


class Request(BaseModel):
    """A request body: plain pydantic (ninja's Schema would validate it twice, to read Django
    models that a request body never holds)."""

    model_config = ConfigDict(strict=True, extra="forbid")


#: The todo, field for field the TypedDict every remote surface answers with.
TodoOut = create_model(  # type: ignore[call-overload]
    "Todo",
    __base__=Schema,
    __doc__=serialize.TodoJSON.__doc__,
    **{name: (hint, ...) for name, hint in get_type_hints(serialize.TodoJSON).items()},
)


class TodoList(Schema):
    todos: list[TodoOut]  # type: ignore[valid-type]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end."
    )


class Claimed(Schema):
    todos: list[TodoOut] = Field(description="Empty when nothing became claimable within `wait`.")  # type: ignore[valid-type]


class Problem(Schema):
    """An RFC 9457 problem (served as application/problem+json)."""

    type: str
    title: str
    status: int
    detail: str


#: The shortest lease the API gives, in seconds: the core takes anything above zero, which a
#: number this small may round to.
MIN_TTL = 0.001
MAX_TTL = validation.MAX_LEASE.total_seconds()
MAX_DELAY = validation.MAX_DELAY.total_seconds()


def _ttl() -> Any:
    return Field(
        default=None,
        ge=MIN_TTL,
        le=MAX_TTL,
        description="Lease length in seconds (at most 12 hours; heartbeat to hold longer). "
        "Left out: the queue's visibility timeout, else SWITCHBOARD_TODOS_DEFAULT_TTL.",
    )


class ClaimIn(Request):
    queues: list[QueueName] | None = Field(
        default=None,
        min_length=1,
        description="Queues to claim from; all the agent's claim queues when left out.",
    )
    ttl: float | None = _ttl()
    wait: float = Field(
        default=0,
        ge=0,
        le=MAX_WAIT,
        description=f"Seconds to wait for a todo when none is claimable (long poll), at most "
        f"{MAX_WAIT}.",
    )
    limit: Integer = Field(
        default=1,
        ge=1,
        le=MAX_CLAIM_LIMIT,
        description=f"Most todos to claim, 1 to {MAX_CLAIM_LIMIT}.",
    )


class ClaimOneIn(Request):
    ttl: float | None = _ttl()


class HeartbeatIn(Request):
    ttl: float | None = _ttl()
    progress: Annotated[Any, json_value(JSON_VALUE)] = Field(
        default=None,
        description="Any JSON value: how far you got, kept as the todo's latest progress note "
        "(omitted: the last note stays; at most SWITCHBOARD_TODOS_MAX_PROGRESS_BYTES as JSON).",
    )


class CompleteIn(Request):
    result: Annotated[Any, json_value(JSON_VALUE)] = Field(
        default=None, description="Any JSON value, stored as the todo's result."
    )


class FailIn(Request):
    error: (
        Annotated[str, text(None)] | Annotated[dict[str, Any], json_value(JSON_OBJECT)] | None
    ) = Field(default=None, description="What went wrong: a message, or an object.")
    retry_in: float | None = Field(
        default=None,
        ge=0,
        le=MAX_DELAY,
        description="Seconds until the retry (at most 30 days), instead of the configured backoff.",
    )


class ReleaseIn(Request):
    delay: float | None = Field(
        default=None,
        ge=0,
        le=MAX_DELAY,
        description="Seconds before it is claimable again (at most 30 days).",
    )


def _after(description: str) -> Any:
    """The todos a todo waits for: 1 to MAX_PARENTS of them, or none (null)."""
    return Field(
        default=None, min_length=1, max_length=validation.MAX_PARENTS, description=description
    )


#: A todo needs a kind or a title (validation.creation): JSON Schema says it with anyOf.
_KIND_OR_TITLE: list[Any] = [
    {"required": ["kind"], "properties": {"kind": {"minLength": 1}}},
    {
        "required": ["title"],
        "properties": {"title": {"pattern": f"[^{validation.WHITESPACE}]"}},
    },
]
#: A todo that waits for others starts when they are done: it has no run_after as well.
_NOT_AFTER_AND_RUN_AFTER: dict[str, Any] = {
    "required": ["after", "run_after"],
    "properties": {"after": {"type": "array"}, "run_after": {"type": "string"}},
}


class CreateIn(Request):
    model_config = ConfigDict(
        json_schema_extra={"anyOf": _KIND_OR_TITLE, "not": _NOT_AFTER_AND_RUN_AFTER}
    )

    queue: QueueName = Field(description="One of the agent's create queues.")
    kind: Kind = Field(default="", description="What the todo is; no whitespace.")
    title: Title = Field(default="", description="A kind or a title (not blank) is required.")
    payload: Annotated[dict[str, Any], json_value(JSON_OBJECT)] | None = None
    idempotency_key: Key | None = Field(
        default=None,
        description="A live todo of the queue you created with this key is returned instead "
        "(200; 409 when it is in a queue you do not claim from). Your keys are your own.",
    )
    assignee: Name | None = Field(default=None, description="Only this agent may claim it.")
    run_after: Moment | None = Field(
        default=None,
        description="RFC 3339 date and time with an offset; not claimable before.",
    )
    max_attempts: (
        Annotated[int, Field(ge=1, le=validation.MAX_ATTEMPTS_LIMIT), BeforeValidator(_integral)]
        | None
    ) = Field(
        default=None,
        description="Attempts before it is a dead letter; default 5 (or the agent's limit).",
    )
    priority: Integer = Field(
        default=0,
        ge=validation.PRIORITY_MIN,
        le=validation.PRIORITY_MAX,
        description="-100 to 100; higher is claimed sooner.",
    )
    concurrency_key: Key | None = Field(
        default=None,
        description="While a todo with this key is claimed, no other todo with it is.",
    )
    fair_key: Key | None = Field(
        default=None,
        description="The tenant it counts for: within a priority, the tenants of a queue take "
        "turns at its claims. Default: you (each of your keys is a tenant of its own).",
    )
    after: list[TodoId] | None = _after(
        "Ids of todos you may see that this one waits for: it is claimable once each is done, "
        "and reads their results in `parent_results`. Not with run_after."
    )
    on_parent_failure: Literal["cancel", "run_anyway"] = Field(
        default="cancel",
        description="When a todo it waits for ends as a dead letter: cancel it too (a dead "
        "letter naming that parent), or run it anyway once the others are done.",
    )


class PlanTodoIn(CreateIn):
    """A todo of a plan: `create_for`'s fields, a `ref`, and `after` naming refs or ids."""

    ref: Ref | None = Field(
        default=None,
        description="The name the plan's other todos give in their `after` to wait for this one.",
    )
    after: list[RefOrId] | None = _after(
        "What this todo waits for: refs of todos of this plan, or ids of existing todos you may "
        "see. Not with run_after."
    )


class PlanIn(Request):
    todos: list[PlanTodoIn] = Field(
        min_length=1,
        max_length=MAX_PLAN,
        description=f"1 to {MAX_PLAN} todos, created whole or not at all when they wait for "
        "each other; the todo that merges the others' work names them all in its `after`.",
    )


class PlannedTodo(Schema):
    todo: TodoOut  # type: ignore[valid-type]
    created: bool = Field(description="False: its idempotency key found a live todo, returned.")


class Planned(Schema):
    todos: list[PlannedTodo] = Field(description="The plan's todos, in the order given.")
