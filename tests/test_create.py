"""Enqueueing: validation before any write, deduplication by idempotency key, scheduling."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos import validation
from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.managers.creating import _batch_rows
from switchboard_todos.models import (
    Event,
    State,
    Todo,
    new_event_id,
    new_todo_id,
    new_todo_ids,
)
from switchboard_todos.transitions import DEFAULT_MAX_ATTEMPTS
from tests.helpers import MakeTodo


def test_create_todo_returns_the_new_pending_todo(db: None) -> None:
    """A new todo is pending, with every argument stored, in one statement."""
    event = Event.objects.create(source="github", kind="push")
    with CaptureQueriesContext(connection) as queries:
        todo, created = Todo.objects.create_todo(
            queue="emails",
            kind="email.send",
            title="Welcome mail",
            payload={"to": "a@example.com"},
            source="signup",
            idempotency_key="user-1",
            assignee="mailer",
            max_attempts=3,
            event=event,
        )
    assert len(queries) == 1
    assert created
    assert todo == Todo.objects.get(queue="emails")
    assert (todo.state, todo.attempt, todo.max_attempts) == (State.PENDING, 0, 3)
    assert (todo.kind, todo.title, todo.source) == ("email.send", "Welcome mail", "signup")
    assert (todo.payload, todo.idempotency_key, todo.assignee) == (
        {"to": "a@example.com"},
        "user-1",
        "mailer",
    )
    assert todo.event_id == event.id
    assert todo.next_retry_at is None


def test_a_duplicate_key_returns_the_live_todo(make_todo: MakeTodo) -> None:
    """A second delivery with the same key creates nothing and returns the first todo."""
    first, created = Todo.objects.create_todo(kind="k", idempotency_key="delivery-7")
    second, created_again = Todo.objects.create_todo(
        kind="other", idempotency_key="delivery-7", payload={"ignored": True}
    )
    assert (created, created_again) == (True, False)
    assert second == first and second.payload == {}
    assert Todo.objects.count() == 1


@pytest.mark.parametrize("state", [State.PENDING, State.CLAIMED])
def test_live_todos_hold_their_key(make_todo: MakeTodo, state: str) -> None:
    """Pending and claimed todos deduplicate (a retry waiting is pending, so it holds too)."""
    live = make_todo(state=state, idempotency_key="k", next_retry_in=None)
    assert Todo.objects.create_todo(kind="k", idempotency_key="k") == (live, False)


@pytest.mark.parametrize("state", [State.DONE, State.FAILED])
def test_finished_todos_release_their_key(make_todo: MakeTodo, state: str) -> None:
    """After done or dead-lettered, the same key enqueues new work."""
    make_todo(state=state, idempotency_key="k")
    todo, created = Todo.objects.create_todo(kind="k", idempotency_key="k")
    assert created and todo.state == State.PENDING


def test_keys_are_per_queue(db: None) -> None:
    """The same key in two queues makes two todos."""
    Todo.objects.create_todo(queue="a", kind="k", idempotency_key="k")
    _, created = Todo.objects.create_todo(queue="b", kind="k", idempotency_key="k")
    assert created


def test_no_key_never_deduplicates(db: None) -> None:
    """Without an idempotency key every call creates a todo."""
    for _ in range(3):
        assert Todo.objects.create_todo(kind="k")[1]
    assert Todo.objects.count() == 3


def test_run_after_schedules_the_todo(db: None) -> None:
    """A future run_after is not claimable until it passes."""
    later = datetime.now(UTC) + timedelta(hours=1)
    todo, _ = Todo.objects.create_todo(kind="k", run_after=later)
    assert todo.next_retry_at == later
    assert Todo.objects.claim_next("default", "w1", 30) is None


def test_a_past_run_after_is_ready_now(db: None) -> None:
    """run_after in the past is the same as none: the todo joins the ready queue."""
    todo, _ = Todo.objects.create_todo(kind="k", run_after=datetime(2000, 1, 1, tzinfo=UTC))
    assert todo.next_retry_at is None
    assert Todo.objects.claim_next("default", "w1", 30) == todo


def test_event_by_id(db: None) -> None:
    """event accepts an Event or its id."""
    event = Event.objects.create(source="s")
    todo, _ = Todo.objects.create_todo(kind="k", event=event.id)
    assert todo.event == event


LONG = "x" * 10_000

INVALID_CREATES: list[tuple[dict[str, Any], str]] = [
    ({"queue": ""}, "queue must not be empty"),
    ({"queue": "has space"}, "is not a valid queue name"),
    ({"queue": "q" * (validation.QUEUE_MAX_LENGTH + 1)}, "the limit is 100"),
    ({"queue": None}, "queue must be a str, not NoneType"),
    ({"kind": "", "title": ""}, "needs a kind or a title"),
    ({"kind": "two words"}, "must not contain whitespace"),
    ({"kind": "k" * (validation.KIND_MAX_LENGTH + 1)}, "kind is 201 characters long"),
    ({"title": LONG}, "title is 10000 characters long"),
    ({"title": "nul\x00"}, "must not contain NUL"),
    ({"source": LONG}, "source is 10000 characters long"),
    ({"idempotency_key": ""}, "idempotency_key must not be empty"),
    ({"idempotency_key": LONG}, "idempotency_key is 10000 characters long"),
    ({"idempotency_key": 7}, "idempotency_key must be a str, not int"),
    ({"assignee": " "}, "assignee must not be empty"),
    ({"payload": ["a list"]}, "payload must be a dict"),
    ({"payload": {"when": datetime.now(UTC)}}, "payload is not JSON-serializable"),
    ({"payload": {"amount": Decimal("1.5")}}, "payload is not JSON-serializable"),
    ({"payload": {"x": float("nan")}}, "payload is not JSON-serializable"),
    ({"payload": {"x": "\x00"}}, "must not contain NUL"),
    ({"max_attempts": 0}, "max_attempts must be between 1 and 1000, not 0"),
    ({"max_attempts": -3}, "max_attempts must be between 1 and 1000"),
    ({"max_attempts": True}, "max_attempts must be an int, not bool"),
    ({"max_attempts": "5"}, "max_attempts must be an int, not str"),
    ({"run_after": datetime(2030, 1, 1)}, "run_after must be an aware datetime; this one has no"),
    ({"run_after": "2030-01-01"}, "run_after must be an aware datetime, not str"),
    ({"run_after": timedelta(minutes=5)}, "run_after must be an aware datetime, not timedelta"),
    ({"event": Event(source="unsaved", id=None)}, "event must be a saved Event"),
]


@pytest.mark.parametrize(("arguments", "message"), INVALID_CREATES)
def test_bad_input_raises_before_any_write(
    db: None, arguments: dict[str, Any], message: str
) -> None:
    """Each kind of bad input raises InvalidTodo (a ValueError) and writes nothing."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo) as caught:
        Todo.objects.create_todo(**{"kind": "k", **arguments})
    assert message in str(caught.value)
    assert isinstance(caught.value, ValueError)
    assert len(queries) == 0


def test_oversize_payload(db: None, settings: Any) -> None:
    """A payload over SWITCHBOARD_TODOS_MAX_JSON_BYTES is refused with its size."""
    settings.SWITCHBOARD_TODOS_MAX_JSON_BYTES = 100
    with pytest.raises(InvalidTodo, match=r"payload is 1\d\d bytes as JSON; the limit is 100"):
        Todo.objects.create_todo(kind="k", payload={"blob": "y" * 100})
    assert not Todo.objects.exists()


def test_create_many_in_one_statement(db: None) -> None:
    """A batch is one statement; results come back in input order."""
    specs = [{"kind": f"k{index}", "payload": {"n": index}} for index in range(50)]
    with CaptureQueriesContext(connection) as queries:
        results = Todo.objects.create_many(specs)
    assert len(queries) == 1
    assert [todo.kind for todo, _ in results] == [f"k{index}" for index in range(50)]
    assert all(created for _, created in results)
    assert Todo.objects.count() == 50


def test_create_many_stores_what_create_todo_stores(db: None) -> None:
    """A batch travels as two JSON values (batch_rows in sql/todos.sql): every column arrives
    as create_todo stores it, quotes, backslashes, non-ASCII text and time zones included."""
    later = datetime(2999, 1, 2, 3, 4, 5, 678901, tzinfo=timezone(timedelta(hours=-9, minutes=-30)))
    specs: list[dict[str, Any]] = [
        {
            "queue": "q.x:y",
            "kind": "k.✓",
            "title": 'a "title" \\ with\nlines 😀',
            "source": "src'",
            "payload": {"n": [1, 2.5, None, True], "s": '"\\', "ü": {}},
            "idempotency_key": 'key "1"',
            "assignee": "agent \\ 7",
            "max_attempts": 7,
            "priority": -42,
            "concurrency_key": "ck ✓",
            "run_after": later,
        },
        {"kind": "plain"},
    ]
    fields = [
        "queue", "kind", "title", "source", "payload", "idempotency_key", "assignee",
        "max_attempts", "priority", "concurrency_key", "next_retry_at", "state",
    ]  # fmt: skip
    batch = Todo.objects.create_many(specs)
    one_by_one = [
        Todo.objects.create_todo(**{**spec, "queue": f"{spec.get('queue', 'default')}-1"})[0]
        for spec in specs
    ]
    for (made, created), single in zip(batch, one_by_one, strict=True):
        assert created
        stored = Todo.objects.get(pk=made.pk)
        alone = Todo.objects.get(pk=single.pk)
        for name in fields:
            expected = getattr(alone, name)
            if name == "queue":
                expected = expected.removesuffix("-1")
            assert getattr(stored, name) == getattr(made, name) == expected, name
    assert Todo.objects.get(pk=batch[0][0].pk).next_retry_at == later


def test_a_create_does_not_read_back_what_it_sent(make_todo: MakeTodo) -> None:
    """A new todo's row comes back without the values its creator gave and those every new todo
    starts with (created_columns in sql/todos.sql: the payload is not sent back), yet the Todo
    each create returns holds every field as a later read of it does; a todo that holds the key
    comes back whole."""
    from switchboard_todos.sql import CREATED_FRESH, CREATED_NULLS, queries

    held = make_todo(queue="q", idempotency_key="taken", payload={"old": True})
    parent, _ = Todo.objects.create_todo(kind="parent")
    spec: dict[str, Any] = {
        "queue": "q",
        "kind": "k",
        "title": "t",
        "source": "s",
        "payload": {"z": 1, "a": [1.5, "é", None], "nested": {"b": {}}},
        "assignee": "agent",
        "priority": 5,
        "concurrency_key": "ck",
    }
    made = [
        Todo.objects.create_todo(**spec, idempotency_key="one"),
        Todo.objects.create_todo(**spec, idempotency_key="child", after=[parent.pk]),
        *Todo.objects.create_many([{**spec, "idempotency_key": "many"}, {**spec}]),
        *Todo.objects.create_many(
            [{**spec, "ref": "a"}, {**spec, "idempotency_key": "graph", "after": ["a"]}]
        ),
        Todo.objects.create_todo(**spec, idempotency_key="taken"),
        *Todo.objects.create_many([{**spec, "idempotency_key": "taken"}]),
    ]
    assert [created for _, created in made] == [True] * 6 + [False] * 2
    for todo, _ in made:
        stored = Todo.objects.get(pk=todo.pk)
        for field in Todo._meta.concrete_fields:
            assert getattr(todo, field.attname) == getattr(stored, field.attname), field.name
    assert made[-1][0] == made[-2][0] == held
    assert made[-1][0].payload == {"old": True}
    params = {
        **validation.creation({**spec, "idempotency_key": "again"}),
        "default_max_attempts": 5,
        "notify": False,
    }
    with connection.cursor() as cursor:
        cursor.execute(queries["create_todo"], params)
        names = [column.name for column in cursor.description]
        row = dict(zip(names, cursor.fetchone(), strict=True))
    assert row["created"] and row["id"] and row["created_at"]
    assert row["payload"] is row["queue"] is row["kind"] is None
    # Nor what every new todo starts with: the model's defaults fill those in.
    assert CREATED_FRESH < CREATED_NULLS
    assert row["state"] is row["errors_dropped"] is row["attempt"] is row["awaited"] is None
    assert type(made[0][0].state) is str and made[0][0].errors == []
    assert made[0][0].errors is not made[2][0].errors  # each its own list


def test_create_many_deduplicates_within_and_across_batches(make_todo: MakeTodo) -> None:
    """Keys held by live todos, or repeated in the batch, return the holder with created=False."""
    live = make_todo(idempotency_key="old")
    results = Todo.objects.create_many(
        [
            {"kind": "k", "idempotency_key": "old"},
            {"kind": "k", "idempotency_key": "new"},
            {"kind": "k", "idempotency_key": "new"},
            {"kind": "k", "queue": "other", "idempotency_key": "old"},
        ]
    )
    assert [created for _, created in results] == [False, True, False, True]
    assert results[0][0] == live
    assert results[2][0] == results[1][0]
    assert Todo.objects.count() == 3


@pytest.mark.parametrize("use_tz", [True, False], ids=["USE_TZ", "naive"])
@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "unprepared"])
def test_create_many_builds_its_todos_as_they_are_stored(
    make_todo: MakeTodo, settings: Any, prepare: bool, use_tz: bool
) -> None:
    """create_many's answer is one row of what the database decided (its now(), the queues'
    defaults, the keys it missed, the scheduled rows' next_retry_at): each Todo it returns,
    built from what was sent, equals a later read of it, field for field and down to a
    timestamp's tzinfo, with or without time zones."""
    from switchboard_todos.models import Queue

    settings.SWITCHBOARD_TODOS_PREPARE = prepare
    settings.USE_TZ = use_tz
    Queue.objects.create(name="strict", max_attempts=2)
    held = make_todo(queue="q", idempotency_key="taken")
    later = datetime.now(UTC) + timedelta(days=1)
    made = Todo.objects.create_many(
        [
            {"queue": "strict", "kind": "k", "payload": {"a": [1, "é"]}, "run_after": later},
            {"queue": "strict", "kind": "k", "max_attempts": 9},
            {"queue": "q", "kind": "k", "run_after": datetime(2000, 1, 1, tzinfo=UTC)},
            {"queue": "q", "kind": "k", "idempotency_key": "taken"},
            {"queue": "q", "kind": "k", "idempotency_key": "new", "priority": 3},
        ]
    )
    assert [created for _, created in made] == [True, True, True, False, True]
    assert made[3][0] == held
    assert [todo.max_attempts for todo, _ in made[:3]] == [2, 9, 5]
    assert made[0][0].next_retry_at is not None and made[2][0].next_retry_at is None
    for todo, _ in made:
        stored = Todo.objects.get(pk=todo.pk)
        for field in Todo._meta.concrete_fields:
            mine, read = getattr(todo, field.attname), getattr(stored, field.attname)
            assert (mine, type(mine)) == (read, type(read)), field.name
            if isinstance(mine, datetime):
                assert mine.tzinfo is read.tzinfo, field.name


def test_create_many_reads_no_todo_but_the_holders_of_missed_keys(make_todo: MakeTodo) -> None:
    """The statement reads no row of todos, whatever its plan (but the probes of fair keys'
    turns, one entry each, fair_turn): a join with the batch to find
    the live todos holding its keys was planned, in a generic plan made while the table was
    nearly empty, as a hash of a sequential scan, and each batch read the whole table. The
    holders of the keys it missed are looked up after it, only when it missed one."""
    from tests.test_queue_defaults import plan_of

    batch = [validation.creation({"kind": "k", "idempotency_key": f"k{n}"}) for n in range(3)]
    params = {
        **_batch_rows(batch, new_todo_ids(len(batch))),
        "default_max_attempts": DEFAULT_MAX_ATTEMPTS,
        "notify": False,
    }
    reads = [
        node
        for node in plan_of("create_many", params)
        if node.get("Relation Name") == "todos" and node["Node Type"] != "ModifyTable"
    ]
    # The probes of the turns of rows with a fair key (fair_turn) are in the plan, and run
    # only for such rows: none here.
    assert [node["Actual Loops"] for node in reads] == [0, 0]
    make_todo(idempotency_key="held")
    with CaptureQueriesContext(connection) as fresh:
        Todo.objects.create_many([{"kind": "k", "idempotency_key": "a"}, {"kind": "k"}])
    with CaptureQueriesContext(connection) as missed:
        results = Todo.objects.create_many([{"kind": "k", "idempotency_key": "held"}])
    assert len(fresh) == 1 and len(missed) == 2
    assert results[0][0].idempotency_key == "held" and not results[0][1]


def test_create_many_validates_everything_first(db: None) -> None:
    """One bad todo in a batch raises, naming it, and writes none of the batch."""
    with pytest.raises(InvalidTodo, match="todo #1: max_attempts"):
        Todo.objects.create_many([{"kind": "k"}, {"kind": "k", "max_attempts": 0}])
    with pytest.raises(InvalidTodo, match="todo #0: unknown arguments: 'colour'"):
        Todo.objects.create_many([{"kind": "k", "colour": "red"}])
    assert not Todo.objects.exists()
    assert Todo.objects.create_many([]) == []


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Todo.objects.claim_next("default", "", 30), "owner must not be empty"),
        (lambda: Todo.objects.claim_next("default", None, 30), "owner must be a str"),  # type: ignore[arg-type]
        (lambda: Todo.objects.claim_next("default", "w\n1", 30), "control characters"),
        (lambda: Todo.objects.claim_next("default", "w1", 0), "ttl must be more than zero"),
        (lambda: Todo.objects.claim_next("default", "w1", -1), "ttl must be more than zero"),
        (lambda: Todo.objects.claim_next("default", "w1", float("inf")), "must be finite"),
        (lambda: Todo.objects.claim_next("default", "w1", "30"), "ttl must be a timedelta"),  # type: ignore[arg-type]
        (lambda: Todo.objects.claim_next("default", "w1", 86_400), "at most 12:00:00"),
        (lambda: Todo.objects.claim_next([], "w1", 30), "at least one queue"),
        (lambda: Todo.objects.claim_next(["a", "b c"], "w1", 30), "not a valid queue name"),
        (lambda: Todo.objects.claim_batch("a", "w1", 30, limit=0), "limit must be between"),
        (lambda: Todo.objects.heartbeat("td_x", "w1", timedelta(0)), "ttl must be more"),
        (lambda: Todo.objects.complete("td_x", "w1", {1j}), "result is not JSON"),
        (lambda: Todo.objects.fail("td_x", "w1", 42), "error must be a str, a dict or an"),
        (lambda: Todo.objects.fail("td_x", "w1", "e", retry_in=-5), "retry_in must be zero"),
        (lambda: Todo.objects.release("td_x", "w1", delay=10**12), "delay must be at most"),
    ],
)
def test_bad_arguments_to_transitions(db: None, call: Callable[[], object], message: str) -> None:
    """Transitions validate before running any statement."""
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo, match=message):
        call()
    assert len(queries) == 0


def test_enqueue_many_copies_rows_in(db: None) -> None:
    """The COPY path stores every argument; what it leaves out gets the database default."""
    later = datetime.now(UTC) + timedelta(hours=1)
    event = Event.objects.create(source="s")
    count = Todo.objects.enqueue_many(
        [
            {"kind": "plain", "payload": {"n": 1}},
            {
                "queue": "mail",
                "kind": "full",
                "title": "T",
                "source": "import",
                "payload": {"n": 2},
                "assignee": "bob",
                "max_attempts": 2,
                "event": event,
                "run_after": later,
            },
        ]
    )
    assert count == 2
    plain = Todo.objects.get(kind="plain")
    assert (plain.queue, plain.title, plain.payload, plain.max_attempts) == (
        "default",
        "",
        {"n": 1},
        5,
    )
    assert (plain.state, plain.attempt, plain.next_retry_at, plain.assignee) == (
        State.PENDING,
        0,
        None,
        None,
    )
    assert plain.id.startswith("td_") and plain.created_at is not None
    full = Todo.objects.get(kind="full")
    assert (full.queue, full.title, full.source, full.assignee) == ("mail", "T", "import", "bob")
    assert (full.max_attempts, full.next_retry_at, full.event_id) == (2, later, event.id)
    assert Todo.objects.claim_next("default", "w1", 30) == plain
    assert Todo.objects.claim_next("mail", "bob", 30) is None


def test_enqueue_many_refuses_keys_and_bad_rows_before_writing(db: None) -> None:
    """COPY cannot deduplicate: a key is refused; any bad row stops the whole batch."""
    with pytest.raises(InvalidTodo, match="todo #1: enqueue_many cannot deduplicate"):
        Todo.objects.enqueue_many([{"kind": "k"}, {"kind": "k", "idempotency_key": "x"}])
    with pytest.raises(InvalidTodo, match="todo #0: queue"):
        Todo.objects.enqueue_many([{"kind": "k", "queue": "bad queue"}])
    with pytest.raises(InvalidTodo, match="todo #0: unknown arguments: .colour."):
        Todo.objects.enqueue_many([{"kind": "k", "colour": "red"}])
    assert not Todo.objects.exists()
    assert Todo.objects.enqueue_many([]) == 0


def test_a_batch_of_ids_is_random_uuids_of_version_4() -> None:
    """create_many's ids, made many at a time from one read of os.urandom, are what
    uuid.uuid4() makes: version 4, the RFC 4122 variant, each digit random."""
    ids = new_todo_ids(2000)
    parsed = [uuid.UUID(todo_id.removeprefix("td_")) for todo_id in ids]
    assert all(todo_id.startswith("td_") for todo_id in ids)
    assert {(one.version, one.variant) for one in parsed} == {(4, uuid.RFC_4122)}
    assert [f"td_{one}" for one in parsed] == ids and len(set(ids)) == 2000
    # The variant digit takes each of its four values: its two free bits are random.
    assert {todo_id[22] for todo_id in ids} == set("89ab")
    assert new_todo_id() != new_todo_id() and new_todo_ids(0) == []
    assert uuid.UUID(new_event_id().removeprefix("ev_")).version == 4
