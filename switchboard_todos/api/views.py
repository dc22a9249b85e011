"""The routes: each authenticates, calls one verb of agents/service/, answers JSON.

`claim` and `get_todo` are async views: under ASGI a long poll (a claim's wait for a todo, a
read's wait for one to end) waits on the LISTEN path without holding a thread, and ends when
its client goes away (Django cancels the view: a claim then claims nothing,
agents/disconnects.py). The other verbs are one statement each, plain views that Django runs
on the request's thread under ASGI: an async view would cost them one more hop between
threads. Under WSGI everything runs too, the async views in an event loop of their request's
thread, which a long poll then occupies for its wait, whether or not its client is still
there (docs/agents.md).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from functools import cached_property, wraps
from typing import Annotated, Any, Literal

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from ninja import NinjaAPI, Query
from ninja.openapi.schema import OpenAPISchema
from ninja.operation import Operation
from ninja.security import HttpBearer
from pydantic import Field

from switchboard_todos import tracing
from switchboard_todos.agents import errors, request_cap, service
from switchboard_todos.agents.serialize import atodos_json, todo_json, todos_json
from switchboard_todos.api import problems
from switchboard_todos.api.schemas import (
    JSON_SCHEMAS,
    Claimed,
    ClaimIn,
    ClaimOneIn,
    CompleteIn,
    CreateIn,
    Cursor,
    FailIn,
    HeartbeatIn,
    PlanIn,
    Planned,
    Problem,
    QueueName,
    ReleaseIn,
    TodoId,
    TodoList,
    TodoOut,
    with_references,
)
from switchboard_todos.models import Agent, Todo


class BearerToken(HttpBearer):
    """`Authorization: Bearer sbt_…`: the agent is the token's, never something in the body.

    The token of an agent at its cap of requests in flight is refused before its lookup.
    """

    def authenticate(self, request: HttpRequest, token: str) -> Agent:
        request_cap.refuse_known(token)
        return service.authenticate(token)


class AgentsAPI(NinjaAPI):
    def get_openapi_operation_id(self, operation: Operation) -> str:
        """Name each operation after its verb (claim, complete…), as the MCP tools are."""
        return operation.view_func.__name__

    def get_openapi_schema(
        self, *, path_prefix: str | None = None, path_params: dict[str, Any] | None = None
    ) -> OpenAPISchema:
        """The schema, built once per prefix: problems typed application/problem+json, the JSON
        values the core takes (schemas.JSON_SCHEMAS), and a body that may be left out an object
        when sent (null is refused)."""
        key = (path_prefix, repr(sorted((path_params or {}).items())))
        if key not in self._schemas:
            schema = super().get_openapi_schema(path_prefix=path_prefix, path_params=path_params)
            schema["paths"] = with_references(schema["paths"])
            schema["components"]["schemas"] = {
                **with_references(schema["components"]["schemas"]),
                **JSON_SCHEMAS,
            }
            for operation in (op for path in schema["paths"].values() for op in path.values()):
                for status, response in operation["responses"].items():
                    if int(status) >= 400:
                        content = response["content"].pop("application/json")
                        response["content"][problems.CONTENT_TYPE] = content
                for status, where in LINKS.get(operation["operationId"], {}).items():
                    operation["responses"][status]["links"] = {
                        verb: {"operationId": verb, "parameters": {"todo_id": where}}
                        for verb in HOLDER_VERBS
                    }
                for content in operation.get("requestBody", {}).get("content", {}).values():
                    body = content["schema"]
                    if "anyOf" in body:
                        [content["schema"]] = [
                            one for one in body["anyOf"] if one != {"type": "null"}
                        ]
            self._schemas[key] = schema
        return self._schemas[key]

    @cached_property
    def _schemas(self) -> dict[tuple[str | None, str], OpenAPISchema]:
        return {}


api = AgentsAPI(
    title="switchboard-todos agents",
    version="1",
    description="The queue's verbs for remote agents. See docs/agents.md.",
    auth=BearerToken(),
    parser=problems.JSONBody(),
    urls_namespace="switchboard_todos_api",
    openapi_url="/openapi.json",
    docs_url=None,
)
problems.install(api)


def in_flight(view: Callable[..., Any]) -> Callable[..., Any]:
    """Run a route counted among its agent's requests in flight (request_cap.py): after ninja
    authenticated the token and checked the request, before the verb's first statement."""
    if inspect.iscoroutinefunction(view):

        @wraps(view)
        async def counted_async(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            with request_cap.admitted(agent_of(request)):
                return await view(request, *args, **kwargs)

        return counted_async

    @wraps(view)
    def counted(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
        with request_cap.admitted(agent_of(request)):
            return view(request, *args, **kwargs)

    return counted


api.add_decorator(in_flight)

#: Where the answers of these operations (by status) name a todo: the schema links them to the
#: verbs on that todo, the agent's loop (a generated client, Schemathesis, follows them).
LINKS = {
    "claim": {200: "$response.body#/todos/0/id"},
    "claim_todo": {200: "$response.body#/id"},
    "create_for": {201: "$response.body#/id", 200: "$response.body#/id"},
    "create_many": {
        201: "$response.body#/todos/0/todo/id",
        200: "$response.body#/todos/0/todo/id",
    },
}
HOLDER_VERBS = ["get_todo", "claim_todo", "heartbeat", "complete", "fail", "release"]
#: What every route may answer besides its success.
PROBLEMS: dict[int, Any] = dict.fromkeys((401, 403, 404, 409, 413, 422, 429, 503), Problem)
ONE = {200: TodoOut, **PROBLEMS}


def agent_of(request: HttpRequest) -> Agent:
    agent: Agent = request.auth  # type: ignore[attr-defined]
    return agent


def json_response(body: Any, status: int = 200) -> HttpResponse:
    """The body as JSON, already in its documented shape (the schema only documents it)."""
    return HttpResponse(json.dumps(body), status=status, content_type="application/json")


def todo_response(todo: Todo, status: int = 200) -> HttpResponse:
    return json_response(todo_json(todo), status)


@csrf_exempt
def unknown_route(request: HttpRequest) -> HttpResponse:
    """Anything else under the API's prefix, the prefix itself included: a problem, not an HTML
    page (nor, for a POST that lacks the trailing slash, Django's APPEND_SLASH error)."""
    hint = "" if request.path.endswith("/") else " The API's paths end with a slash."
    return problems.problem_response(
        errors.ROUTE_NOT_FOUND, f"No route {request.method} {request.path}.{hint}"
    )


@api.get("/todos/", response={200: TodoList, **PROBLEMS}, url_name="todos")
def list_todos(
    request: HttpRequest,
    queue: Query[list[QueueName] | None] = None,
    state: Literal["pending", "claimed"] = "pending",
    limit: Annotated[int, Field(ge=1, le=service.MAX_PAGE)] = service.DEFAULT_PAGE,
    cursor: Cursor | None = None,
) -> HttpResponse:
    """The pending todos you may claim (oldest first), or with `state=claimed` those you hold."""
    page = service.list_todos(
        agent_of(request), queues=queue, state=state, limit=limit, cursor=cursor
    )
    return json_response({"todos": todos_json(page.todos), "next_cursor": page.next_cursor})


@api.post("/todos/", response={201: TodoOut, 200: TodoOut, **PROBLEMS})
def create_for(request: HttpRequest, body: CreateIn) -> HttpResponse:
    """Create a todo in one of your create queues: 201 and its Location when new, 200 with the
    live todo when its idempotency key found one."""
    with tracing.remote(request.headers):
        todo, created = service.create_for(agent_of(request), **body.model_dump())
    if not created:
        return todo_response(todo)
    response = todo_response(todo, 201)
    response["Location"] = f"{request.path}{todo.id}/"
    return response


# Before `todos/{todo_id}/`, which would take its path: a todo whose id is "batch" is read
# through the list, not here (GET on this path is a 405).
@api.post("/todos/batch/", response={201: Planned, 200: Planned, **PROBLEMS})
def create_many(request: HttpRequest, body: PlanIn) -> HttpResponse:
    """Create a plan in one call: todos that may wait for each other (`ref`, `after`), whole
    or not at all; 201 when it created any, 200 when their idempotency keys found every one
    live. 409 (invalid-plan): they wait for each other in a way that can never run."""
    with tracing.remote(request.headers):
        made = service.create_many_for(
            agent_of(request), todos=[todo.model_dump(exclude_none=True) for todo in body.todos]
        )
    shaped = todos_json([todo for todo, _created in made])
    created = [created for _todo, created in made]
    answer = [{"todo": t, "created": c} for t, c in zip(shaped, created, strict=True)]
    return json_response({"todos": answer}, 201 if any(created) else 200)


@api.get("/todos/{todo_id}/", response=ONE, url_name="todo")
async def get_todo(
    request: HttpRequest,
    todo_id: TodoId,
    wait: Annotated[float, Field(ge=0, le=service.MAX_WAIT)] = 0,
) -> HttpResponse:
    """One todo you may read: one you created, of your claim queues, or held by you. With
    `wait` (seconds, at most 20), long-poll until it is done or failed, as a claim's wait: the
    answer is the todo as it ended, or as it is when `wait` has passed."""
    todo = await service.aget_todo(agent_of(request), todo_id, wait=wait)
    [shaped] = await atodos_json([todo])
    return json_response(shaped)


@api.post("/claim/", response={200: Claimed, **PROBLEMS})
async def claim(request: HttpRequest, body: ClaimIn | None = None) -> HttpResponse:
    """Claim up to `limit` todos; with `wait`, long-poll until one is claimable."""
    body, agent = body or ClaimIn(), agent_of(request)
    todos = await service.aclaim(
        agent, queues=body.queues, ttl=body.ttl, wait=body.wait, limit=body.limit
    )
    return json_response({"todos": await service.handing_over(agent, todos, atodos_json(todos))})


@api.post("/todos/{todo_id}/claim/", response=ONE)
def claim_todo(
    request: HttpRequest, todo_id: TodoId, body: ClaimOneIn | None = None
) -> HttpResponse:
    """Claim this todo."""
    todos = service.claim(agent_of(request), todo_id=todo_id, ttl=(body or ClaimOneIn()).ttl)
    return todo_response(todos[0])


@api.post("/todos/{todo_id}/heartbeat/", response=ONE)
def heartbeat(
    request: HttpRequest, todo_id: TodoId, body: HeartbeatIn | None = None
) -> HttpResponse:
    """Extend your lease to `ttl` seconds from now, with a `progress` note. 409: the lease is
    lost, or (problem type todo-cancelled) an operator cancelled the todo; stop working."""
    beat = body or HeartbeatIn()
    return todo_response(service.heartbeat(agent_of(request), todo_id, beat.ttl, beat.progress))


@api.post("/todos/{todo_id}/complete/", response=ONE)
def complete(request: HttpRequest, todo_id: TodoId, body: CompleteIn | None = None) -> HttpResponse:
    """Mark the todo you hold done, with its `result`."""
    return todo_response(
        service.complete(agent_of(request), todo_id, (body or CompleteIn()).result)
    )


@api.post("/todos/{todo_id}/fail/", response=ONE)
def fail(request: HttpRequest, todo_id: TodoId, body: FailIn | None = None) -> HttpResponse:
    """Report a failed attempt: retried after a backoff, dead-lettered at the cap. Counts
    against your quota of fails and releases a minute (429 past it: the todo stays held)."""
    body = body or FailIn()
    todo = service.fail(agent_of(request), todo_id, body.error, body.retry_in)
    return todo_response(todo)


@api.post("/todos/{todo_id}/release/", response=ONE)
def release(request: HttpRequest, todo_id: TodoId, body: ReleaseIn | None = None) -> HttpResponse:
    """Give the todo back without using up an attempt. Counts against your quota of fails and
    releases a minute (429 past it: the todo stays held)."""
    return todo_response(service.release(agent_of(request), todo_id, (body or ReleaseIn()).delay))
