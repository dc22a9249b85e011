"""The request and response bodies, as pydantic models: they validate types, the core the rest.

Request models are strict (a number is not a string, a bool is not an int) and refuse fields
they do not know, so that a misspelt or forbidden field (an `owner`, say: it comes from the
token) is an error, not silently ignored. Ranges (ttl, wait, limit) are the core's to check,
so that HTTP and MCP say the same thing.
"""

from __future__ import annotations

from typing import Any, get_type_hints

from ninja import Schema
from pydantic import BaseModel, ConfigDict, Field, create_model

from switchboard_todos.agents import serialize
from switchboard_todos.agents.service import MAX_CLAIM_LIMIT, MAX_WAIT


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


TTL = Field(description="Lease length in seconds (at most 12 hours); heartbeat to hold longer.")


class ClaimIn(Request):
    queues: list[str] | None = Field(
        default=None, description="Queues to claim from; all the agent's claim queues when omitted."
    )
    ttl: float = TTL
    wait: float = Field(
        default=0,
        description=f"Seconds to wait for a todo when none is claimable (long poll), at most "
        f"{MAX_WAIT}.",
    )
    limit: int = Field(default=1, description=f"Most todos to claim, 1 to {MAX_CLAIM_LIMIT}.")


class ClaimOneIn(Request):
    ttl: float = TTL


class HeartbeatIn(Request):
    ttl: float = TTL
    progress: Any = Field(
        default=None,
        description="Any JSON value: how far you got, kept as the todo's latest progress note "
        "(omitted: the last note stays).",
    )


class CompleteIn(Request):
    result: Any = Field(default=None, description="Any JSON value, stored as the todo's result.")


class FailIn(Request):
    error: str | dict[str, Any] | None = Field(default=None, description="What went wrong.")
    retry_in: float | None = Field(
        default=None, description="Seconds until the retry, instead of the configured backoff."
    )


class ReleaseIn(Request):
    delay: float | None = Field(default=None, description="Seconds before it is claimable again.")


class CreateIn(Request):
    queue: str = Field(description="One of the agent's create queues.")
    kind: str = ""
    title: str = ""
    payload: dict[str, Any] | None = None
    idempotency_key: str | None = Field(
        default=None,
        description="A live todo of the queue you created with this key is returned instead "
        "(200; 409 when it is in a queue you do not claim from). Your keys are your own.",
    )
    assignee: str | None = Field(default=None, description="Only this agent may claim it.")
    run_after: str | None = Field(
        default=None,
        description="ISO 8601 date and time with an offset; not claimable before.",
        json_schema_extra={"format": "date-time"},
    )
    max_attempts: int | None = Field(
        default=None,
        description="Attempts before it is a dead letter; default 5 (or the agent's limit).",
    )
    priority: int = Field(default=0, description="-100 to 100; higher is claimed sooner.")
    concurrency_key: str | None = Field(
        default=None,
        description="While a todo with this key is claimed, no other todo with it is.",
    )
