"""The agents' HTTP API through Django's request stack: the verbs, the auth matrix, bad input.

Every refusal answers its documented status with an RFC 9457 problem and writes no todo.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import OperationalError, ProgrammingError, connection
from django.test import Client

from switchboard_todos.agents import accounts
from switchboard_todos.claims import long_polls
from switchboard_todos.models import Agent, State, Todo

pytestmark = pytest.mark.django_db

API = "/api"


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    yield
    long_polls.stop()


class AgentClient:
    """An HTTP client holding one agent's token."""

    def __init__(self, client: Client, token: str | None) -> None:
        self.client = client
        self.headers = {} if token is None else {"Authorization": f"Bearer {token}"}

    def get(self, path: str, **query: Any) -> Any:
        return self.client.get(f"{API}{path}", query, headers=self.headers)

    def post(self, path: str, body: Any = None, *, raw: bytes | str | None = None) -> Any:
        data = raw if raw is not None else ("" if body is None else json.dumps(body))
        return self.client.post(
            f"{API}{path}", data, content_type="application/json", headers=self.headers
        )


@pytest.fixture
def tokens() -> dict[str, str]:
    """a1 claims from work and more and creates in work and inbox; a2 claims from work."""
    return {
        "a1": accounts.create_agent(
            "a1", claim_queues=["work", "more"], create_queues=["work", "inbox"]
        )[1],
        "a2": accounts.create_agent("a2", claim_queues=["work"])[1],
    }


@pytest.fixture
def a1(client: Client, tokens: dict[str, str]) -> AgentClient:
    return AgentClient(client, tokens["a1"])


def todos_table() -> list[dict[str, Any]]:
    return [dict(row) for row in Todo.objects.order_by("id").values()]


def assert_problem(response: Any, status: int, detail: str = "") -> dict[str, Any]:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status and body["type"].startswith("https://")
    assert body["title"] and detail in body["detail"]
    assert "Traceback" not in response.content.decode()
    return body


# The verbs


def test_create_claim_heartbeat_complete(a1: AgentClient) -> None:
    created = a1.post(
        "/todos/", {"queue": "work", "kind": "k", "payload": {"n": 1}, "idempotency_key": "x"}
    )
    assert created.status_code == 201
    todo = created.json()
    assert created["Location"] == f"{API}/todos/{todo['id']}/"
    assert (
        todo["source"] == "agent:a1" and todo["state"] == "pending" and todo["payload"] == {"n": 1}
    )
    again = a1.post("/todos/", {"queue": "work", "kind": "k", "idempotency_key": "x"})
    assert again.status_code == 200 and again.json()["id"] == todo["id"]
    assert a1.get(created["Location"].removeprefix(API)).json() == todo

    claimed = a1.post("/claim/", {"queues": ["work"], "ttl": 30})
    assert claimed.status_code == 200
    assert [t["id"] for t in claimed.json()["todos"]] == [todo["id"]]
    assert claimed.json()["todos"][0]["owner"] == "a1"
    beat = a1.post(f"/todos/{todo['id']}/heartbeat/", {"ttl": 60})
    assert (
        beat.status_code == 200
        and beat.json()["lease_expires_at"] > claimed.json()["todos"][0]["lease_expires_at"]
    )
    done = a1.post(f"/todos/{todo['id']}/complete/", {"result": {"ok": True}})
    assert done.json()["state"] == "done" and done.json()["result"] == {"ok": True}
    assert Todo.objects.get(pk=todo["id"]).state == State.DONE


def test_create_with_a_priority_is_claimed_first(a1: AgentClient) -> None:
    a1.post("/todos/", {"queue": "work", "kind": "later"})
    urgent = a1.post("/todos/", {"queue": "work", "kind": "now", "priority": 90}).json()
    assert urgent["priority"] == 90
    claimed = a1.post("/claim/", {"queues": ["work"], "ttl": 30}).json()["todos"]
    assert [todo["id"] for todo in claimed] == [urgent["id"]]
    assert_problem(a1.post("/todos/", {"queue": "work", "kind": "k", "priority": 101}), 422)


def test_fail_release_and_claim_by_id(a1: AgentClient, make_todo: Callable[..., Todo]) -> None:
    todo = make_todo(queue="work")
    claimed = a1.post(f"/todos/{todo.id}/claim/", {"ttl": 30})
    assert claimed.status_code == 200 and claimed.json()["attempt"] == 1
    failed = a1.post(f"/todos/{todo.id}/fail/", {"error": "boom", "retry_in": 0})
    assert failed.json()["state"] == "pending" and failed.json()["last_error"]["message"] == "boom"
    assert a1.post(f"/todos/{todo.id}/claim/", {"ttl": 30}).json()["attempt"] == 2
    released = a1.post(f"/todos/{todo.id}/release/", {"delay": 60})
    assert released.json()["state"] == "pending" and released.json()["attempt"] == 1
    assert released.json()["next_retry_at"] is not None


def test_complete_without_a_body(a1: AgentClient, make_todo: Callable[..., Todo]) -> None:
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    done = a1.post(f"/todos/{todo.id}/complete/")
    assert done.status_code == 200 and done.json()["result"] is None


def test_claim_batch_and_empty_claim(a1: AgentClient, make_todo: Callable[..., Todo]) -> None:
    for _ in range(3):
        make_todo(queue="more")
    assert len(a1.post("/claim/", {"ttl": 30, "limit": 10}).json()["todos"]) == 3
    assert a1.post("/claim/", {"ttl": 30, "wait": 0}).json() == {"todos": []}


def test_a_claim_or_heartbeat_without_a_ttl_takes_the_default_lease(
    a1: AgentClient, make_todo: Callable[..., Todo], settings: Any
) -> None:
    """No ttl (or no body at all): the queue's visibility timeout, else
    SWITCHBOARD_TODOS_DEFAULT_TTL, on the database's clock."""
    settings.SWITCHBOARD_TODOS_DEFAULT_TTL = 45
    todo = make_todo(queue="work")
    [claimed] = a1.post("/claim/").json()["todos"]
    assert claimed["id"] == todo.id
    held = Todo.objects.get(pk=todo.pk)
    assert held.lease_expires_at and held.claimed_at
    assert held.lease_expires_at - held.claimed_at == timedelta(seconds=45)
    assert a1.post(f"/todos/{todo.id}/heartbeat/", {}).status_code == 200
    assert a1.post(f"/todos/{todo.id}/release/").status_code == 200
    assert a1.post(f"/todos/{todo.id}/claim/").status_code == 200


def test_list_todos_pages(a1: AgentClient, make_todo: Callable[..., Todo]) -> None:
    made = [make_todo(queue="work").id for _ in range(5)]
    make_todo(queue="elsewhere")
    seen: list[str] = []
    query: dict[str, Any] = {"limit": 2, "queue": ["work", "more"]}
    while True:
        page = a1.get("/todos/", **query).json()
        seen += [todo["id"] for todo in page["todos"]]
        if page["next_cursor"] is None:
            break
        query["cursor"] = page["next_cursor"]
    assert sorted(seen) == sorted(made) and len(seen) == 5
    assert a1.get("/todos/", state="claimed").json() == {"todos": [], "next_cursor": None}


def test_one_http_call_is_two_statements(
    a1: AgentClient, make_todo: Callable[..., Todo], django_assert_num_queries: Callable[..., Any]
) -> None:
    """The agent's lookup, then the transition."""
    make_todo(queue="work")
    with django_assert_num_queries(2):
        todo = a1.post("/claim/", {"ttl": 30}).json()["todos"][0]
    with django_assert_num_queries(2):
        a1.post(f"/todos/{todo['id']}/complete/", {"result": 1})


def test_openapi_schema_is_generated_and_public(client: Client) -> None:
    schema = client.get(f"{API}/openapi.json").json()
    assert schema["openapi"].startswith("3.1")
    operations = {
        operation["operationId"] for path in schema["paths"].values() for operation in path.values()
    }
    assert operations == {
        "list_todos",
        "create_for",
        "create_many",
        "get_todo",
        "claim",
        "claim_todo",
        "heartbeat",
        "complete",
        "fail",
        "release",
    }
    assert schema["components"]["securitySchemes"]["BearerToken"]["scheme"] == "bearer"
    refusal = schema["paths"]["/api/claim/"]["post"]["responses"]["409"]["content"]
    assert list(refusal) == ["application/problem+json"]
    links = schema["paths"]["/api/claim/"]["post"]["responses"]["200"]["links"]
    assert links["complete"] == {
        "operationId": "complete",
        "parameters": {"todo_id": "$response.body#/todos/0/id"},
    }


# The auth matrix


@pytest.mark.parametrize(
    ("headers", "invalid_token"),
    [
        ({}, False),
        ({"Authorization": "Basic YTpi"}, False),
        ({"Authorization": "Bearer "}, False),
        ({"Authorization": "Bearer sbt_wrong"}, True),
        ({"Authorization": "Bearer sbt_" + "A" * 43}, True),
    ],
    ids=["none", "basic", "empty", "malformed", "unknown"],
)
def test_no_or_wrong_token_is_401(
    client: Client, make_todo: Callable[..., Todo], headers: dict[str, str], invalid_token: bool
) -> None:
    make_todo(queue="work")
    before = todos_table()
    response = client.post(
        f"{API}/claim/", json.dumps({"ttl": 30}), content_type="application/json", headers=headers
    )
    assert_problem(response, 401)
    challenge = response["WWW-Authenticate"]
    assert challenge.startswith("Bearer ")
    assert ('error="invalid_token"' in challenge) is invalid_token
    assert todos_table() == before


def test_revoked_token_is_401(
    client: Client, tokens: dict[str, str], make_todo: Callable[..., Todo]
) -> None:
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    accounts.revoke(accounts.create_agent("a3")[0])  # another agent's revocation is not a1's
    accounts.revoke(Agent.objects.get(name="a1"))
    before = todos_table()
    response = AgentClient(client, tokens["a1"]).post(f"/todos/{todo.id}/complete/", {})
    assert_problem(response, 401, "revoked")
    assert 'error="invalid_token"' in response["WWW-Authenticate"]
    assert todos_table() == before


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/claim/", {"queues": ["elsewhere"], "ttl": 30}),
        ("post", "/claim/", {"queues": ["work", "elsewhere"], "ttl": 30}),
        ("get", "/todos/", {"queue": "elsewhere"}),
        ("post", "/todos/", {"queue": "more", "kind": "k"}),  # a claim queue, not a create queue
    ],
)
def test_queue_not_granted_is_403(
    a1: AgentClient, make_todo: Callable[..., Todo], method: str, path: str, body: dict[str, Any]
) -> None:
    make_todo(queue="work")
    make_todo(queue="elsewhere")
    before = todos_table()
    response = a1.post(path, body) if method == "post" else a1.get(path, **body)
    assert_problem(response, 403, "elsewhere" if "elsewhere" in str(body) else "more")
    assert todos_table() == before


@pytest.mark.parametrize("verb", ["heartbeat", "complete", "fail", "release"])
def test_another_agents_lease_is_409_with_the_core_message(
    a1: AgentClient, make_todo: Callable[..., Todo], verb: str
) -> None:
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a2")
    before = todos_table()
    body = {"ttl": 30} if verb == "heartbeat" else {}
    response = a1.post(f"/todos/{todo.id}/{verb}/", body)
    assert_problem(response, 409, f"Todo {todo.id} is claimed by 'a2', not by 'a1'.")
    assert todos_table() == before


def test_claiming_a_todo_another_agent_holds_is_409(
    a1: AgentClient, make_todo: Callable[..., Todo]
) -> None:
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a2")
    before = todos_table()
    assert_problem(a1.post(f"/todos/{todo.id}/claim/", {"ttl": 30}), 409, "claimed by 'a2'")
    assert todos_table() == before


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("get", "", None),
        ("post", "claim/", {"ttl": 30}),
        ("post", "heartbeat/", {"ttl": 30}),
        ("post", "complete/", {}),
        ("post", "fail/", {}),
        ("post", "release/", {}),
    ],
)
@pytest.mark.parametrize("hidden", ["assigned", "other queue", "unknown"])
def test_another_agents_assigned_todo_and_other_queues_are_404_like_unknown_ids(
    a1: AgentClient,
    make_todo: Callable[..., Todo],
    method: str,
    suffix: str,
    body: Any,
    hidden: str,
) -> None:
    if hidden == "assigned":
        todo_id = make_todo(queue="work", assignee="a2").id
    elif hidden == "other queue":
        todo_id = make_todo(queue="elsewhere").id
    else:
        todo_id = "td_00000000-0000-0000-0000-000000000000"
    before = todos_table()
    path = f"/todos/{todo_id}/{suffix}"
    response = a1.post(path, body) if method == "post" else a1.get(path)
    problem = assert_problem(response, 404)
    assert problem["detail"] == f"Todo {todo_id!r} does not exist."
    assert todos_table() == before


# Bad input


HUGE = b'{"queue": "work", "kind": "k", "payload": {"x": "' + b"y" * 3_000_000 + b'"}}'


@pytest.mark.parametrize(
    ("path", "raw", "status", "detail"),
    [
        ("/claim/", "{not json", 422, "not JSON"),
        ("/claim/", b"\xff\xfe\x00", 422, "not JSON"),
        ("/claim/", "[1, 2]", 422, "JSON object"),
        ("/claim/", "null", 422, "must be a JSON object"),
        ("/claim/", '{"ttl": "30"}', 422, "ttl"),
        ("/claim/", '{"ttl": true}', 422, "ttl"),
        ("/claim/", '{"ttl": 30, "limit": 2.5}', 422, "limit"),
        ("/claim/", '{"ttl": 30, "queues": "work"}', 422, "queues"),
        ("/claim/", '{"ttl": 30, "owner": "a2"}', 422, "owner"),
        ("/claim/", '{"ttl": 0}', 422, "ttl: Input should be greater than or equal to 0.001"),
        ("/claim/", '{"ttl": NaN}', 422, "ttl"),
        ("/claim/", '{"ttl": 1e309}', 422, "ttl"),
        (
            "/claim/",
            '{"ttl": 30, "wait": 21}',
            422,
            "wait: Input should be less than or equal to 20",
        ),
        (
            "/claim/",
            '{"ttl": 30, "limit": 11}',
            422,
            "limit: Input should be less than or equal to 10",
        ),
        ("/claim/", '{"ttl": 30, "limit": 100000000000000000000000}', 422, "limit"),
        ("/claim/", '{"ttl": 30, "queues": ["bad name"]}', 422, "not a valid queue name"),
        ("/claim/", '{"ttl": 30, "queues": ["\\ud800"]}', 422, "surrogate"),
        ("/todos/", '{"queue": "work", "title": "\\udfff"}', 422, "surrogate"),
        ("/todos/", '{"queue": "work", "kind": "k", "payload": {"\\ud83d": 1}}', 422, "surrogate"),
        ("/todos/", '{"queue": "work", "title": "nul \\u0000"}', 422, "NUL"),
        ("/todos/", '{"queue": "work", "kind": "k", "payload": [1]}', 422, "payload"),
        ("/todos/", '{"queue": "work", "kind": "k", "run_after": "soon"}', 422, "RFC 3339"),
        (
            "/todos/",
            '{"queue": "work", "kind": "k", "run_after": "2030-01-01 09:00:00"}',
            422,
            "RFC 3339",
        ),
        ("/todos/", '{"queue": "work", "kind": "k", "max_attempts": 0}', 422, "max_attempts"),
        (
            "/todos/",
            '{"queue": "work", "kind": "k", "payload": ' + "[" * 5000 + "]" * 5000 + "}",
            422,
            "deeper",
        ),
        (
            "/todos/",
            '{"queue": "work", "kind": "k", "payload": {"a": ' + "[" * 150 + "]" * 150 + "}}",
            422,
            "deeper",
        ),
        (
            "/todos/",
            '{"queue": "work", "kind": "k", "payload": {"x": "' + "y" * 1_100_000 + '"}}',
            422,
            "the limit is",
        ),
        ("/todos/", HUGE, 413, "too large"),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    a1: AgentClient,
    make_todo: Callable[..., Todo],
    path: str,
    raw: str | bytes,
    status: int,
    detail: str,
) -> None:
    make_todo(queue="work")
    before = todos_table()
    assert_problem(a1.post(path, raw=raw), status, detail)
    assert todos_table() == before


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ({"limit": "abc"}, "limit"),
        ({"limit": 101}, "limit: Input should be less than or equal to 100"),
        ({"cursor": "W10"}, "cursor"),
        ({"state": "done"}, "state"),
        ({"cursor": "garbage"}, "cursor"),
        ({"queue": "bad name"}, "not a valid queue name"),
    ],
)
def test_bad_list_queries_are_422(a1: AgentClient, query: dict[str, Any], detail: str) -> None:
    assert_problem(a1.get("/todos/", **query), 422, detail)


def test_odd_ids_are_refused_without_a_server_error(a1: AgentClient) -> None:
    before = todos_table()
    assert_problem(a1.get("/todos/td%00x/"), 422, "NUL")
    assert_problem(a1.get(f"/todos/{'x' * 200}/"), 422, "todo id")
    assert_problem(a1.post("/todos/%ED%A0%80/complete/", {}), 404)
    assert todos_table() == before


def test_a_method_a_route_does_not_take_is_a_405_problem(a1: AgentClient) -> None:
    for response, allowed in [
        (a1.client.put(f"{API}/claim/", headers=a1.headers), "POST"),
        (a1.client.delete(f"{API}/todos/", headers=a1.headers), "GET, POST"),
    ]:
        assert_problem(response, 405, "This path takes")
        assert sorted(response["Allow"].split(", ")) == sorted(allowed.split(", "))


@pytest.mark.parametrize(
    ("path", "detail"),
    [
        ("/claim", "end with a slash"),
        ("/nowhere/", "No route POST /api/nowhere/"),
        ("/todos/a%2F%0A/complete/", "No route POST /api/todos/a/\n/complete/"),
        ("/%0A", "No route POST /api/\n"),
    ],
)
def test_unknown_routes_are_problems_even_without_the_trailing_slash(
    settings: Any, a1: AgentClient, path: str, detail: str
) -> None:
    settings.DEBUG = True  # where APPEND_SLASH would raise for a POST without the slash
    assert_problem(a1.post(path, {"ttl": 30}), 404, detail)


def test_the_prefix_itself_is_no_route(tokens: dict[str, str]) -> None:
    """Before, ninja's page: an HTML 404, and a CSRF refusal of a POST (checked, as a browser's
    POST is: the test client skips the check unless asked)."""
    client = Client(enforce_csrf_checks=True, headers={"Authorization": f"Bearer {tokens['a1']}"})
    assert_problem(client.get(f"{API}/"), 404, "No route GET /api/.")
    assert_problem(client.post(f"{API}/", "{}", "application/json"), 404, "No route POST /api/.")


def fail_statements(error: Exception) -> Callable[..., Any]:
    def execute(*args: Any) -> Any:
        raise error

    return execute


def test_an_unreachable_database_is_503_with_retry_after(a1: AgentClient) -> None:
    with connection.execute_wrapper(fail_statements(OperationalError("connection refused"))):
        response = a1.post("/claim/", {"ttl": 30})
    assert_problem(response, 503, "unavailable")
    assert response["Retry-After"] == "5"


def test_a_fault_of_ours_is_a_500_problem_without_a_traceback(a1: AgentClient) -> None:
    with connection.execute_wrapper(fail_statements(ProgrammingError("column x does not exist"))):
        response = a1.post("/claim/", {"ttl": 30})
    body = assert_problem(response, 500, "logged")
    assert "column x" not in body["detail"]
