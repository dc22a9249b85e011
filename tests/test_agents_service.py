"""The remote agents' service layer: identity, grants, visibility, and the verbs on the core."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from asgiref.sync import async_to_sync
from django.db import connection
from django.db.models.functions import Now

from switchboard_todos.agents import accounts, errors, service, tokens
from switchboard_todos.agents.serialize import TodoJSON, todo_json
from switchboard_todos.claims import long_polls
from switchboard_todos.exceptions import (
    InvalidTodo,
    NotAuthenticated,
    QueueNotGranted,
    TodoConflict,
    TodoError,
    TodoNotFound,
)
from switchboard_todos.models import Agent, State, Todo
from tests.conftest import database_url

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _stop_listeners() -> Iterator[None]:
    yield
    long_polls.stop()


@pytest.fixture
def agent() -> Agent:
    """Agent `a1`: claims from `work` and `more`, creates in `work` and `inbox`."""
    return accounts.create_agent(
        "a1", claim_queues=["work", "more"], create_queues=["work", "inbox"]
    )[0]


def db_now() -> Any:
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        return cursor.fetchone()[0]


# Tokens and authentication


def test_tokens_are_random_prefixed_and_stored_only_as_a_hash() -> None:
    agent, token = accounts.create_agent("bot", claim_queues=["work"])
    assert token.startswith("sbt_") and tokens.well_formed(token)
    assert len(token) - len("sbt_") >= 43  # 32 random bytes, base64url
    assert agent.token_hash == tokens.token_hash(token) != token
    assert agent.token_prefix == token[: tokens.SHOWN_LENGTH]
    stored = Agent.objects.filter(name="bot").values_list().get()
    assert token not in [str(value) for value in stored]
    assert accounts.create_agent("bot2")[1] != token


def test_authenticate_finds_the_agent_in_one_statement(
    django_assert_num_queries: Callable[..., Any],
) -> None:
    agent, token = accounts.create_agent("bot", claim_queues=["work"])
    with django_assert_num_queries(1):
        assert service.authenticate(token).pk == agent.pk


@pytest.mark.parametrize("token", [None, "", "Bearer", "sbt_short", "x" * 47, "sbt_" + "A" * 43])
def test_authenticate_refuses_missing_malformed_and_unknown_tokens(token: str | None) -> None:
    accounts.create_agent("bot")
    with pytest.raises(NotAuthenticated):
        service.authenticate(token)


def test_revoked_token_is_refused_and_rotate_replaces_it() -> None:
    agent, token = accounts.create_agent("bot")
    accounts.revoke(agent)
    with pytest.raises(NotAuthenticated, match="revoked"):
        service.authenticate(token)
    new_token = accounts.rotate_token(agent)
    assert agent.is_active and agent.token_generation == 2
    assert service.authenticate(new_token).pk == agent.pk
    with pytest.raises(NotAuthenticated, match="Unknown token"):
        service.authenticate(token)


def test_last_seen_is_written_at_most_once_a_minute() -> None:
    agent, token = accounts.create_agent("bot")
    assert agent.last_seen_at is None
    service.authenticate(token)
    first = Agent.objects.get(pk=agent.pk).last_seen_at
    assert first is not None
    Agent.objects.filter(pk=agent.pk).update(last_seen_at=Now() - timedelta(seconds=50))
    recent = Agent.objects.get(pk=agent.pk).last_seen_at
    service.authenticate(token)
    assert Agent.objects.get(pk=agent.pk).last_seen_at == recent
    Agent.objects.filter(pk=agent.pk).update(last_seen_at=Now() - timedelta(seconds=70))
    service.authenticate(token)
    assert Agent.objects.get(pk=agent.pk).last_seen_at == db_now()  # this transaction's now()


@pytest.mark.django_db(transaction=True)
def test_authentication_does_not_wait_for_the_agents_row_to_mark_it_seen() -> None:
    """A session holding the agent's row (its own create counting its quota, say) does not hold
    up its next request's authentication: the mark is skipped, and made by a later request.
    It used to wait for the row, holding a connection before the request could be counted."""
    agent, token = accounts.create_agent("bot")
    with psycopg.connect(database_url()) as holder:
        holder.execute("SELECT 1 FROM todo_agents WHERE id = %s FOR NO KEY UPDATE", [agent.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '5s'")  # a wait fails the test, not hangs it
        try:
            assert service.authenticate(token).pk == agent.pk
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        assert Agent.objects.get(pk=agent.pk).last_seen_at is None
    service.authenticate(token)
    assert Agent.objects.get(pk=agent.pk).last_seen_at is not None


def test_revoked_agent_is_not_marked_seen() -> None:
    agent, token = accounts.create_agent("bot")
    accounts.revoke(agent)
    with pytest.raises(NotAuthenticated):
        service.authenticate(token)
    assert Agent.objects.get(pk=agent.pk).last_seen_at is None


@pytest.mark.parametrize("name", ["", "has space", "-dash-first", "x" * 101, "nul\x00"])
def test_create_agent_refuses_bad_names(name: str) -> None:
    with pytest.raises(InvalidTodo):
        accounts.create_agent(name)
    assert not Agent.objects.exists()


def test_create_agent_refuses_a_taken_name_and_bad_queues(agent: Agent) -> None:
    with pytest.raises(InvalidTodo, match="exists"):
        accounts.create_agent("a1")
    with pytest.raises(InvalidTodo, match="queue"):
        accounts.create_agent("a2", claim_queues=["no spaces please"])
    assert list(Agent.objects.values_list("name", flat=True)) == ["a1"]


# Claiming: the owner is the agent, the queues its grants


def test_claim_takes_from_every_granted_queue_as_the_agent(
    agent: Agent, make_todo: Callable[..., Todo], django_assert_num_queries: Callable[..., Any]
) -> None:
    first = make_todo(queue="more", created_ago=timedelta(seconds=2))
    second = make_todo(queue="work", created_ago=timedelta(seconds=1))
    make_todo(queue="elsewhere", created_ago=timedelta(seconds=3))
    with django_assert_num_queries(1):
        claimed = service.claim(agent, ttl=30, limit=10)
    assert [todo.id for todo in claimed] == [first.id, second.id]
    assert {todo.owner for todo in claimed} == {"a1"}


def test_claim_from_a_queue_not_granted_raises_and_claims_nothing(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    make_todo(queue="elsewhere")
    make_todo(queue="work")
    with pytest.raises(QueueNotGranted, match="'elsewhere'"):
        service.claim(agent, queues=["work", "elsewhere"], ttl=30)
    assert not Todo.objects.filter(state=State.CLAIMED).exists()


def test_agent_without_claim_queues_may_not_claim() -> None:
    agent = accounts.create_agent("producer", create_queues=["work"])[0]
    with pytest.raises(QueueNotGranted, match="any queue"):
        service.claim(agent, ttl=30)


@pytest.mark.parametrize(
    "arguments",
    [
        {"limit": 0},
        {"limit": 11},
        {"limit": "2"},
        {"wait": 21},
        {"wait": -1},
        {"wait": float("nan")},
        {"ttl": 0},
        {"ttl": "30"},
        {"queues": []},
        {"queues": ["bad name"]},
        {"queues": ["work"], "todo_id": "td_x"},
        {"todo_id": "td_x", "wait": 5},
        {"todo_id": "td_x", "limit": 2},
        {"todo_id": 7},
        {"todo_id": "td\x00"},
    ],
)
def test_claim_refuses_bad_arguments_before_writing(
    agent: Agent, make_todo: Callable[..., Todo], arguments: dict[str, Any]
) -> None:
    make_todo(queue="work")
    with pytest.raises(InvalidTodo):
        service.claim(agent, **{"ttl": 30, **arguments})
    assert not Todo.objects.filter(state=State.CLAIMED).exists()


def test_todo_assigned_to_another_agent_is_invisible(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    theirs = make_todo(queue="work", assignee="a2")
    mine = make_todo(queue="work", assignee="a1")
    assert [todo.id for todo in service.claim(agent, ttl=30, limit=10)] == [mine.id]
    with pytest.raises(TodoNotFound):
        service.claim(agent, todo_id=theirs.id, ttl=30)
    with pytest.raises(TodoNotFound):
        service.get_todo(agent, theirs.id)
    assert service.list_todos(agent).todos == []


def test_claim_by_id_answers_another_queue_as_an_unknown_id(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    hidden = make_todo(queue="elsewhere")
    with pytest.raises(TodoNotFound) as other_queue:
        service.claim(agent, todo_id=hidden.id, ttl=30)
    with pytest.raises(TodoNotFound) as unknown:
        service.claim(agent, todo_id="td_unknown", ttl=30)
    assert str(other_queue.value) == str(unknown.value).replace("td_unknown", hidden.id)
    assert Todo.objects.get(pk=hidden.pk).state == State.PENDING


def test_claim_by_id_of_a_todo_held_by_another_agent_is_a_conflict(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    held = make_todo(queue="work", state=State.CLAIMED, owner="a2")
    with pytest.raises(TodoConflict, match="claimed by 'a2'"):
        service.claim(agent, todo_id=held.id, ttl=30)
    todo = make_todo(queue="work")
    assert service.claim(agent, todo_id=todo.id, ttl=30)[0].owner == "a1"


@pytest.mark.django_db(transaction=True)  # its claims run on the claim threads' connections
def test_aclaim_waits_without_a_thread_and_returns_empty_when_nothing_comes(
    agent: Agent,
) -> None:
    assert async_to_sync(service.aclaim)(agent, ttl=30, wait=0.2) == []


@pytest.mark.django_db(transaction=True)
def test_aclaim_by_id_and_from_queues() -> None:
    agent = accounts.create_agent("a1", claim_queues=["work"])[0]
    first, _ = Todo.objects.create_todo(queue="work", kind="k")
    second, _ = Todo.objects.create_todo(queue="work", kind="k")
    by_id = async_to_sync(service.aclaim)(agent, todo_id=second.id, ttl=30)
    assert [todo.id for todo in by_id] == [second.id]
    from_queue = async_to_sync(service.aclaim)(agent, ttl=30, wait=1)
    assert [todo.id for todo in from_queue] == [first.id]


# The holder's verbs


@pytest.mark.parametrize(
    "verb",
    [
        lambda agent, todo_id: service.heartbeat(agent, todo_id, 30),
        lambda agent, todo_id: service.complete(agent, todo_id, {"ok": True}),
        lambda agent, todo_id: service.fail(agent, todo_id, "boom"),
        lambda agent, todo_id: service.release(agent, todo_id),
    ],
    ids=["heartbeat", "complete", "fail", "release"],
)
def test_holder_verbs_respect_leases_queues_and_assignees(
    agent: Agent, make_todo: Callable[..., Todo], verb: Callable[[Agent, str], Todo]
) -> None:
    theirs = make_todo(queue="work", state=State.CLAIMED, owner="a2")
    with pytest.raises(TodoConflict, match="claimed by 'a2', not by 'a1'"):
        verb(agent, theirs.id)
    other_queue = make_todo(queue="elsewhere", state=State.CLAIMED, owner="a2")
    assigned = make_todo(queue="work", state=State.CLAIMED, owner="a2", assignee="a2")
    for hidden in (other_queue.id, assigned.id, "td_unknown"):
        with pytest.raises(TodoNotFound, match=hidden):
            verb(agent, hidden)
    unchanged = {"state": State.CLAIMED, "owner": "a2"}
    for todo in (theirs, other_queue, assigned):
        assert Todo.objects.filter(pk=todo.pk, **unchanged).exists()
    mine = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    assert verb(agent, mine.id).id == mine.id


def test_a_verb_works_out_no_row_layout_again_from_one_call_to_the_next(
    agent: Agent, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The service pins a copy of the manager at each call (`db_manager`); the layouts of its
    rows are the model's, kept across copies, not worked out at every call."""
    from switchboard_todos.managers import machinery, rows

    def verbs() -> None:
        created, _ = service.create_for(agent, queue="work", kind="kind", payload={"n": 1})
        (claimed,) = service.claim(agent, queues=["work"], ttl=30)
        service.heartbeat(agent, claimed.id, 30)
        service.complete(agent, claimed.id, {"ok": True})
        assert created.id == claimed.id

    verbs()
    verbs()  # the first claim is the full statement; from the second, the lean one (lean claims)
    built: list[rows.Layout] = []

    def layout(*args: Any, **kwargs: Any) -> rows.Layout:
        built.append(rows.Layout(*args, **kwargs))
        return built[-1]

    monkeypatch.setattr(machinery, "Layout", layout)
    verbs()
    assert built == []
    assert Todo.objects.db_manager("default")._kept is Todo.objects._kept


def test_holder_keeps_its_todo_after_losing_the_queue_grant(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    held = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    agent.claim_queues = ["more"]
    assert service.get_todo(agent, held.id).id == held.id
    assert service.complete(agent, held.id).state == State.DONE


def test_lost_lease_is_a_conflict_with_the_core_message(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    todo = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    Todo.objects.expire_lease(todo.id)
    Todo.objects.claim(todo.id, "a2", 30)
    with pytest.raises(TodoConflict) as lost:
        service.complete(agent, todo.id)
    assert errors.kind_of(lost.value).status == 409
    assert str(lost.value) == f"Todo {todo.id} is claimed by 'a2', not by 'a1'."


# Reading


def test_list_todos_pages_oldest_first_with_a_cursor(
    agent: Agent, make_todo: Callable[..., Todo], django_assert_num_queries: Callable[..., Any]
) -> None:
    made = [
        make_todo(
            queue="work" if number % 2 else "more", created_ago=timedelta(seconds=10 - number)
        )
        for number in range(5)
    ]
    make_todo(queue="elsewhere")
    make_todo(queue="work", state=State.DONE)
    seen: list[str] = []
    cursor = None
    while True:
        with django_assert_num_queries(1):
            page = service.list_todos(agent, limit=2, cursor=cursor)
        seen += [todo.id for todo in page.todos]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == [todo.id for todo in made]
    only_work = service.list_todos(agent, queues=["work"]).todos
    assert [todo.id for todo in only_work] == [made[1].id, made[3].id]


def test_list_todos_claimed_lists_what_the_agent_holds(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    mine = make_todo(queue="work", state=State.CLAIMED, owner="a1")
    make_todo(queue="work", state=State.CLAIMED, owner="a2")
    make_todo(queue="work")
    assert [todo.id for todo in service.list_todos(agent, state="claimed").todos] == [mine.id]
    assert service.list_todos(agent, state="claimed", queues=["more"]).todos == []


@pytest.mark.parametrize(
    "arguments",
    [
        {"limit": 0},
        {"limit": 101},
        {"state": "done"},
        {"cursor": "not a cursor"},
        {"cursor": "W10"},
        {"cursor": "x" * 300},
        {"cursor": "1:\x00"},
        {"cursor": "1:\ud800"},
        {"cursor": "1" * 19 + ":td"},
        {"queues": ["bad name"]},
    ],
)
def test_list_todos_refuses_bad_arguments(agent: Agent, arguments: dict[str, Any]) -> None:
    with pytest.raises(InvalidTodo):
        service.list_todos(agent, **arguments)


@pytest.mark.parametrize("cursor", ["0:", "-999999999999999999:x", "999999999999999999:td_ü y"])
def test_any_cursor_of_the_documented_shape_is_a_position(agent: Agent, cursor: str) -> None:
    """Beyond the dates Python holds, the first or last position: never a refusal."""
    assert service.list_todos(agent, cursor=cursor).next_cursor is None


def test_list_todos_of_a_queue_not_granted(agent: Agent) -> None:
    with pytest.raises(QueueNotGranted):
        service.list_todos(agent, queues=["elsewhere"])


def test_get_todo_answers_another_queue_as_an_unknown_id(
    agent: Agent, make_todo: Callable[..., Todo]
) -> None:
    mine = make_todo(queue="work")
    hidden = make_todo(queue="elsewhere")
    assert service.get_todo(agent, mine.id).id == mine.id
    with pytest.raises(TodoNotFound):
        service.get_todo(agent, hidden.id)


def test_get_todo_reads_the_todos_the_agent_created_wherever_they_went(agent: Agent) -> None:
    """A todo an agent handed to a queue it does not claim from, even assigned to another
    agent, is the creator's to read; for another agent it stays an unknown id."""
    other = accounts.create_agent("other", claim_queues=["work"])[0]
    todo, _ = service.create_for(agent, queue="inbox", kind="k", assignee="x")
    assert service.get_todo(agent, todo.id).id == todo.id
    with pytest.raises(TodoNotFound):
        service.get_todo(other, todo.id)


# Creating


def test_create_for_records_the_agent_and_deduplicates(agent: Agent) -> None:
    todo, created = service.create_for(
        agent, queue="work", kind="mail.send", payload={"to": "x"}, idempotency_key="k1"
    )
    assert created and todo.source == "agent:a1" and todo.queue == "work"
    again, created = service.create_for(agent, queue="work", kind="mail.send", idempotency_key="k1")
    assert not created and again.id == todo.id
    assert todo_json(again)["idempotency_key"] == "k1"
    assert Todo.objects.get(pk=todo.pk).idempotency_key == "agent:a1/k1"
    later, _ = service.create_for(agent, queue="work", title="t", run_after="2100-01-01T00:00:00Z")
    assert later.next_retry_at is not None and later.next_retry_at.year == 2100


def test_create_for_refuses_queues_not_granted_and_bad_input(agent: Agent) -> None:
    with pytest.raises(QueueNotGranted):
        service.create_for(agent, queue="more", kind="k")  # claim only, not create
    for bad in (
        {"queue": "work"},  # neither kind nor title
        {"queue": "work", "kind": "k", "payload": []},
        {"queue": "work", "kind": "k", "run_after": "tomorrow"},
        {"queue": "work", "kind": "k", "run_after": "2100-01-01T00:00:00"},  # naive
        {"queue": "work", "kind": "k", "max_attempts": 0},
    ):
        with pytest.raises(InvalidTodo):
            service.create_for(agent, **bad)
    assert not Todo.objects.exists()


# The error table and the JSON shape


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotAuthenticated("x"), 401),
        (QueueNotGranted("x"), 403),
        (TodoNotFound("td_x"), 404),
        (TodoConflict("x", todo_id="td_x"), 409),
        (InvalidTodo("x"), 422),
    ],
)
def test_error_table(error: TodoError, status: int) -> None:
    kind = errors.kind_of(error)
    assert kind.status == status
    body = errors.problem(kind, str(error))
    assert body == {"type": kind.type, "title": kind.title, "status": status, "detail": str(error)}
    assert kind.type.endswith(f"agents.md#{kind.slug}")


def test_todo_json_has_one_shape(make_todo: Callable[..., Todo]) -> None:
    todo = make_todo(state=State.CLAIMED, owner="a1", payload={"n": 1})
    Todo.objects.fail(todo.id, "a1", "boom")
    shaped = todo_json(Todo.objects.get(pk=todo.pk))
    assert list(shaped) == list(TodoJSON.__annotations__)
    assert shaped["state"] == State.PENDING and shaped["payload"] == {"n": 1}
    assert shaped["last_error"] == {"type": "", "message": "boom"}
    assert shaped["created_at"] is not None and shaped["created_at"].endswith("+00:00")
    assert todo_json(Todo.objects.create_todo(kind="k")[0])["last_error"] is None
