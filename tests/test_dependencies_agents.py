"""Remote agents plan work as todos that wait for todos: `create_for(after=...)` and
`create_many_for` in the service, over HTTP, and the todo shape that carries the parents'
results. An agent waits only for todos it may see; a plan that can never run is refused (409)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test import Client

from switchboard_todos.agents import accounts, errors, service
from switchboard_todos.agents.serialize import todo_json, todos_json
from switchboard_todos.conf import conf
from switchboard_todos.exceptions import (
    InvalidPlan,
    InvalidTodo,
    QueueNotGranted,
    Throttled,
    TodoConflict,
    TodoNotFound,
)
from switchboard_todos.models import Agent, State, Todo
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db

API = "/api"


@pytest.fixture
def planner() -> Agent:
    """Creates in `work` and `handoff`, claims from `work` only."""
    return accounts.create_agent(
        "planner", claim_queues=["work"], create_queues=["work", "handoff"]
    )[0]


def plan(parts: int, **merge: Any) -> list[dict[str, Any]]:
    """`parts` todos of queue work, and a merge that waits for them all."""
    return [
        {"queue": "work", "kind": "part", "ref": f"part-{n}", "idempotency_key": f"part-{n}"}
        for n in range(parts)
    ] + [
        {
            "queue": "work",
            "kind": "merge",
            "ref": "merge",
            "after": [f"part-{n}" for n in range(parts)],
            "idempotency_key": "merge",
            **merge,
        }
    ]


def counted(agent: Agent) -> int:
    """The creations the agent owes: paid for ahead of the database's clock (which stands still
    in a test's transaction), at its quota."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT round(coalesce(greatest(extract(epoch FROM creates_paid_until - now()), 0), 0)"
            " * coalesce(max_creates_per_minute, %s) / 60) FROM todo_agents WHERE id = %s",
            [conf.AGENT_MAX_CREATES_PER_MINUTE, agent.pk],
        )
        return int(cursor.fetchone()[0])


# create_for(after=...)


def test_create_for_waits_for_a_todo_the_agent_sees(planner: Agent, make_todo: MakeTodo) -> None:
    parent = make_todo(queue="work", state=State.CLAIMED, owner="w1")
    child, created = service.create_for(
        planner, queue="handoff", kind="merge", after=[parent.id], on_parent_failure="run_anyway"
    )
    assert created and child.blocked and child.parents == [parent.id]
    assert child.on_parent_failure == "run_anyway" and child.source == "agent:planner"


@pytest.mark.parametrize("where", ["unknown", "other queue", "assigned to another"])
def test_create_for_answers_a_parent_it_cannot_see_as_an_unknown_id(
    planner: Agent, make_todo: MakeTodo, where: str
) -> None:
    """Exactly the answer of an unknown id: nothing says the todo exists, no todo is written,
    and it counts as a create whichever it is (the database read for it)."""
    todo_id = {
        "unknown": "td_nope",
        "other queue": make_todo(queue="secret").id,
        "assigned to another": make_todo(queue="work", assignee="someone").id,
    }[where]
    before = Todo.objects.count()
    with pytest.raises(TodoNotFound) as refused:
        service.create_for(planner, queue="work", kind="k", after=[todo_id])
    assert str(refused.value) == str(TodoNotFound(todo_id))
    assert Todo.objects.count() == before and counted(planner) == 1


def test_an_agent_may_wait_for_a_todo_it_holds_in_a_queue_it_no_longer_claims(
    planner: Agent, make_todo: MakeTodo
) -> None:
    held = make_todo(queue="elsewhere", state=State.CLAIMED, owner="planner")
    child, _ = service.create_for(planner, queue="work", kind="k", after=[held.id])
    assert child.parents == [held.id] and child.blocked


# create_many_for


def test_a_plan_is_created_in_one_call_with_the_agents_rules(planner: Agent) -> None:
    """Source, scoped keys and max_attempts as create_for gives them; refs become ids."""
    Agent.objects.filter(pk=planner.pk).update(max_attempts_limit=3)
    planner.refresh_from_db()
    made = service.create_many_for(planner, todos=plan(3, concurrency_key="one"))
    todos = [todo for todo, _ in made]
    assert [created for _, created in made] == [True] * 4
    *parts, merge = todos
    assert merge.parents == [part.id for part in parts] and merge.waiting_for == 3
    assert {todo.source for todo in todos} == {"agent:planner"}
    assert merge.idempotency_key == "agent:planner/merge"
    assert merge.concurrency_key == "agent:planner/one"
    assert {todo.max_attempts for todo in todos} == {3}
    assert todo_json(merge)["idempotency_key"] == "merge"
    assert counted(planner) == 4


def test_a_plan_sent_again_returns_the_same_todos(planner: Agent) -> None:
    first = service.create_many_for(planner, todos=plan(2))
    again = service.create_many_for(planner, todos=plan(2))
    assert [todo for todo, _ in again] == [todo for todo, _ in first]
    assert [created for _, created in again] == [False] * 3
    assert Todo.objects.count() == 3


def test_a_plan_may_wait_for_existing_todos_it_sees(planner: Agent, make_todo: MakeTodo) -> None:
    fetched = make_todo(queue="work", state=State.DONE, result={"rows": 3})
    running = make_todo(queue="work", state=State.CLAIMED, owner="w1")
    [(report, _)] = service.create_many_for(
        planner, todos=[{"queue": "handoff", "kind": "report", "after": [fetched.id, running.id]}]
    )
    assert report.parents == [fetched.id, running.id] and report.waiting_for == 1


@pytest.mark.parametrize("where", ["unknown", "other queue"])
def test_a_plan_waiting_for_a_todo_the_agent_cannot_see_is_refused_as_unknown(
    planner: Agent, make_todo: MakeTodo, where: str
) -> None:
    hidden = "td_nope" if where == "unknown" else make_todo(queue="secret").id
    todos = [*plan(1), {"queue": "work", "kind": "late", "after": ["merge", hidden]}]
    with pytest.raises(TodoNotFound) as refused:
        service.create_many_for(planner, todos=todos)
    assert str(refused.value) == str(TodoNotFound(hidden))
    assert Todo.objects.filter(source="agent:planner").count() == 0 and counted(planner) == 3


@pytest.mark.parametrize(
    ("todos", "message"),
    [
        (
            [
                {"queue": "work", "kind": "a", "ref": "a", "after": ["b"]},
                {"queue": "work", "kind": "b", "ref": "b", "after": ["a"]},
            ],
            "in a cycle: a, b",
        ),
        ([{"queue": "work", "kind": "a", "ref": "a", "after": ["a"]}], "waits for itself"),
        (
            [
                {"queue": "work", "kind": "a", "ref": "x"},
                {"queue": "work", "kind": "b", "ref": "x"},
            ],
            "names two todos",
        ),
    ],
)
def test_a_plan_that_can_never_run_is_an_invalid_plan(
    planner: Agent, todos: list[dict[str, Any]], message: str
) -> None:
    """The parts conflict, each well formed: 409 invalid-plan on every surface, nothing made."""
    with pytest.raises(InvalidPlan, match=message) as refused:
        service.create_many_for(planner, todos=todos)
    kind = errors.kind_of(refused.value)
    assert (kind.status, kind.slug, kind.title, kind.sqs) == (
        409,
        "invalid-plan",
        "The plan cannot run",
        "InvalidParameterValue",
    )
    assert "nothing was created" in kind.advice
    assert not Todo.objects.exists() and counted(planner) == 0


@pytest.mark.parametrize(
    ("todo", "error", "message"),
    [
        ({"queue": "secret", "kind": "k"}, QueueNotGranted, "todo #1: .* queue 'secret'"),
        ({"queue": "work", "kind": "k", "source": "me"}, InvalidTodo, "todo #1: unknown .*source"),
        ({"queue": "work", "kind": "k", "max_attempts": 26}, InvalidTodo, "todo #1: max_attempts"),
        ({"kind": "k"}, InvalidTodo, "todo #1: queue is required"),
        ({"queue": "work", "kind": "k", "ref": 7}, InvalidTodo, "todo #1: ref must be a str"),
        ({"queue": "work", "kind": "k", "after": "part-0"}, InvalidTodo, "todo #1: after must"),
        ("not a todo", InvalidTodo, "todo #1: a todo must be an object"),
    ],
)
def test_a_bad_todo_in_a_plan_is_named_and_nothing_is_written(
    planner: Agent, todo: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        service.create_many_for(planner, todos=[{"queue": "work", "kind": "first"}, todo])
    assert not Todo.objects.exists() and counted(planner) == 0


@pytest.mark.parametrize(("todos", "message"), [([], "at least one"), ("x", "must be a list")])
def test_a_plan_holds_one_to_a_thousand_todos(planner: Agent, todos: Any, message: str) -> None:
    with pytest.raises(InvalidTodo, match=message):
        service.create_many_for(planner, todos=todos)
    with pytest.raises(InvalidTodo, match="at most 1000"):
        service.create_many_for(
            planner, todos=({"queue": "work", "kind": "k"} for _ in range(1001))
        )


def test_a_plan_counts_each_of_its_todos_against_the_quota_at_once(planner: Agent) -> None:
    """Counted in the one statement; past the quota the whole plan is refused, and one larger
    than the quota could never pass, so it is invalid rather than throttled."""
    Agent.objects.filter(pk=planner.pk).update(max_creates_per_minute=6, burst_seconds=60)
    planner.refresh_from_db()
    service.create_many_for(planner, todos=plan(3))
    assert counted(planner) == 4
    with pytest.raises(Throttled, match="no room for 3 creations now: its quota of 6") as past:
        service.create_many_for(planner, todos=plan(2, idempotency_key="other"))
    assert past.value.retry_after >= 1
    with pytest.raises(InvalidTodo, match="counts 7 creations"):
        service.create_many_for(planner, todos=plan(6))
    assert counted(planner) == 4 and Todo.objects.count() == 4
    service.create_many_for(planner, todos=[{"queue": "work", "kind": k} for k in "ab"])
    assert counted(planner) == 6


def test_each_ten_parents_a_todo_names_count_as_one_more_creation(
    planner: Agent, make_todo: MakeTodo
) -> None:
    """A parent named is a read and an edge written: a child of 25 parents counts 3 creations,
    so one token cannot name a thousand parents six hundred times a minute."""
    parents = [make_todo(queue="work").id for _ in range(25)]
    service.create_for(planner, queue="work", kind="k", after=parents)
    assert counted(planner) == 3
    service.create_many_for(
        planner, todos=[{"queue": "work", "kind": "k", "after": parents[:10]}] * 2
    )
    assert counted(planner) == 7


def test_a_plans_key_held_by_a_todo_the_agent_cannot_see_names_none(planner: Agent) -> None:
    hidden, _ = service.create_for(planner, queue="handoff", kind="k", idempotency_key="k")
    with pytest.raises(TodoConflict, match="'k' is taken in queue 'handoff'") as refused:
        service.create_many_for(
            planner, todos=[{"queue": "handoff", "kind": "k", "idempotency_key": "k"}]
        )
    assert hidden.id not in str(refused.value)


def test_what_a_plan_costs(planner: Agent, django_assert_num_queries: Any) -> None:
    """The same statements for a plan of 2 todos or 200: the quota counted once, the plan in
    one statement (each in a savepoint here, inside the test's transaction)."""
    for parts in (1, 199):
        Agent.objects.filter(pk=planner.pk).update(creates_paid_until=None)
        with django_assert_num_queries(6):  # 2 savepoints, count_creates, create_graph, 2 releases
            service.create_many_for(
                planner, todos=[{**each, "idempotency_key": None} for each in plan(parts)]
            )


# The todo shape


def test_a_todo_shows_its_parents_and_their_results(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """One query for the results of the parents of every todo shown; none without parents."""
    done = make_todo(state=State.DONE, result={"n": 1})
    failed = make_todo(state=State.FAILED)
    running = make_todo(state=State.CLAIMED, owner="w1")
    merge, _ = Todo.objects.create_todo(
        kind="merge", after=[done.id, running.id], on_parent_failure="run_anyway"
    )
    other, _ = Todo.objects.create_todo(kind="other", after=[done.id])
    with django_assert_num_queries(0):
        plain = todo_json(failed)
    assert (plain["parents"], plain["waiting_for"], plain["parent_results"]) == (None, 0, None)
    with django_assert_num_queries(1):
        shaped = todos_json([merge, failed, other])
    assert shaped[0]["parents"] == [done.id, running.id] and shaped[0]["waiting_for"] == 1
    assert shaped[0]["parent_results"] == {done.id: {"n": 1}, running.id: None}
    assert shaped[2]["parent_results"] == {done.id: {"n": 1}}


# Over HTTP


@pytest.fixture
def http(client: Client, planner: Agent) -> Any:
    token = accounts.rotate_token(planner)

    def post(path: str, body: Any) -> Any:
        return client.post(
            f"{API}{path}",
            json.dumps(body),
            content_type="application/json",
            headers={"Authorization": f"Bearer {token}"},
        )

    return post


def test_http_creates_a_plan_and_answers_each_todo(http: Any) -> None:
    created = http("/todos/batch/", {"todos": plan(2)})
    assert created.status_code == 201, created.content
    answered = created.json()["todos"]
    assert [each["created"] for each in answered] == [True] * 3
    parts, merge = [each["todo"] for each in answered[:2]], answered[2]["todo"]
    assert merge["parents"] == [part["id"] for part in parts] and merge["waiting_for"] == 2
    assert merge["parent_results"] == {part["id"]: None for part in parts}
    assert merge["state"] == "pending" and merge["idempotency_key"] == "merge"
    again = http("/todos/batch/", {"todos": plan(2)})
    assert again.status_code == 200
    assert [each["todo"]["id"] for each in again.json()["todos"]] == [
        each["todo"]["id"] for each in answered
    ]


def test_http_create_takes_after(http: Any, make_todo: MakeTodo) -> None:
    parent = make_todo(queue="work", state=State.CLAIMED, owner="w1")
    created = http("/todos/", {"queue": "work", "kind": "k", "after": [parent.id]})
    assert created.status_code == 201 and created.json()["waiting_for"] == 1
    hidden = make_todo(queue="secret")
    unseen = http("/todos/", {"queue": "work", "kind": "k", "after": [hidden.id]})
    assert unseen.status_code == 404 and unseen.json()["type"] == errors.TODO_NOT_FOUND.type


def work(kind: str, **more: Any) -> dict[str, Any]:
    return {"queue": "work", "kind": kind, **more}


@pytest.mark.parametrize(
    ("todos", "status", "kind"),
    [
        ([work("a", ref="a", after=["a"])], 409, errors.INVALID_PLAN),
        ([work("a", ref="x"), work("b", ref="x")], 409, errors.INVALID_PLAN),
        ([work("a", after=["b"], run_after="2100-01-01T00:00:00Z")], 422, errors.INVALID_INPUT),
        ([], 422, errors.INVALID_INPUT),
        ([work("a", source="x")], 422, errors.INVALID_INPUT),
        ([work("a", on_parent_failure="ignore")], 422, errors.INVALID_INPUT),
    ],
)
def test_http_refuses_a_bad_plan_as_a_problem(
    http: Any, todos: list[dict[str, Any]], status: int, kind: errors.ErrorKind
) -> None:
    refused = http("/todos/batch/", {"todos": todos})
    assert refused.status_code == status, refused.content
    assert refused["Content-Type"] == "application/problem+json"
    assert (refused.json()["type"], refused.json()["title"]) == (kind.type, kind.title)
    assert not Todo.objects.exists()


def test_the_batch_path_takes_only_post(client: Client) -> None:
    answer = client.get(f"{API}/todos/batch/")
    assert answer.status_code == 405 and answer["Allow"] == "POST"
