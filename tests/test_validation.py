"""Hostile input: every public manager method answers a typed error or succeeds, never more.

Unpaired surrogates, NUL, deep nesting, ids of the wrong type, unknown events: each once raised
DataError, UnicodeEncodeError, ProgrammingError, TypeError, RecursionError or IntegrityError
from inside a statement. The property test throws arbitrary text and JSON at every method and
holds it to "success or a TodoError, and a TodoError writes nothing".
"""

from __future__ import annotations

import asyncio
import inspect
import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchboard_todos import validation
from switchboard_todos.events import EventManager
from switchboard_todos.exceptions import InvalidTodo, TodoError
from switchboard_todos.managers import TodoManager
from switchboard_todos.models import Event, State, Todo

MakeTodo = Callable[..., Todo]
LONE = "a\ud800b"


def nested(depth: int) -> dict[str, Any]:
    """A JSON object `depth` levels deep, built without recursion."""
    value: dict[str, Any] = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


#: Each reproduced fault: the call, and what the InvalidTodo says.
FAULTS: dict[str, tuple[Callable[[], object], str]] = {
    "title": (lambda: Todo.objects.create_todo(kind="k", title=LONE), "title contains an unpaired"),
    "kind": (lambda: Todo.objects.create_todo(kind=LONE), "kind contains an unpaired"),
    "source": (lambda: Todo.objects.create_todo(kind="k", source=LONE), "source contains"),
    "key": (lambda: Todo.objects.create_todo(kind="k", idempotency_key=LONE), "idempotency_key"),
    "payload key": (lambda: Todo.objects.create_todo(kind="k", payload={LONE: 1}), "payload"),
    "payload value": (lambda: Todo.objects.create_todo(kind="k", payload={"a": LONE}), "payload"),
    "deep payload": (
        lambda: Todo.objects.create_todo(kind="k", payload=nested(5000)),
        "payload nests arrays and objects too deeply",
    ),
    "payload past the depth limit": (
        lambda: Todo.objects.create_todo(kind="k", payload=nested(validation.MAX_JSON_DEPTH + 1)),
        f"payload nests arrays and objects {validation.MAX_JSON_DEPTH + 1} levels deep",
    ),
    "event id with a surrogate": (
        lambda: Todo.objects.create_todo(kind="k", event=LONE),
        "event contains an unpaired",
    ),
    "event of the wrong type": (
        lambda: Todo.objects.create_todo(kind="k", event=7),  # type: ignore[arg-type]
        "event must be an Event or its id",
    ),
    "unsaved event": (
        lambda: Todo.objects.create_todo(kind="k", event=Event(source="s")),
        "event must be a saved Event",
    ),
    "int id": (lambda: Todo.objects.claim(5, "w1", 10), "todo id must be a str, not int"),  # type: ignore[arg-type]
    "list id": (lambda: Todo.objects.release(["x"], "w1"), "todo id must be a str, not list"),  # type: ignore[arg-type]
    "NUL id": (lambda: Todo.objects.heartbeat("td\x00", "w1", 10), "must not contain NUL"),
    "surrogate id": (lambda: Todo.objects.complete(LONE, "w1"), "todo id contains an unpaired"),
    "surrogate owner": (lambda: Todo.objects.claim_next("q", LONE, 10), "owner contains"),
    "int queues": (lambda: Todo.objects.claim_batch(5, "w1", 10, 1), "queues must be"),  # type: ignore[arg-type]
    "surrogate result": (lambda: Todo.objects.complete("td_x", "w1", LONE), "result contains"),
    "deep result": (lambda: Todo.objects.complete("td_x", "w1", nested(5000)), "too deeply"),
    "surrogate error": (lambda: Todo.objects.fail("td_x", "w1", ValueError(LONE)), "error"),
    "complete_many int id": (lambda: Todo.objects.complete_many("w1", {5: 1}), "must be a str"),  # type: ignore[dict-item]
    "complete_many not a mapping": (
        lambda: Todo.objects.complete_many("w1", [1]),  # type: ignore[arg-type]
        "results must map todo ids to results, not list",
    ),
    "requeue surrogate id": (lambda: Todo.objects.requeue(LONE), "todo id contains"),
    "surrogate reason": (lambda: Todo.objects.cancel("td_x", LONE), "reason contains"),
    "enqueue_many surrogate": (
        lambda: Todo.objects.enqueue_many([{"kind": LONE}]),
        "todo #0: kind contains an unpaired",
    ),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_bad_input_is_refused_before_any_statement(db: None, fault: str) -> None:
    """Each reproduced fault is an InvalidTodo that says what is wrong, and nothing ran."""
    call, message = FAULTS[fault]
    with CaptureQueriesContext(connection) as queries, pytest.raises(InvalidTodo, match=message):
        call()
    assert queries.captured_queries == []


def test_an_unknown_event_id_is_refused_after_one_lookup(db: None) -> None:
    """An event named by id is looked up, once per batch, before the insert."""
    known = Event.objects.create(source="s")
    specs = [{"kind": "k", "event": known.pk}, {"kind": "k", "event": "ev_missing"}]
    with CaptureQueriesContext(connection) as queries:
        with pytest.raises(InvalidTodo, match="event 'ev_missing' does not exist"):
            Todo.objects.create_many(specs)
        with pytest.raises(InvalidTodo, match="event 'ev_missing' does not exist"):
            Todo.objects.create_todo(kind="k", event="ev_missing")
    assert [query["sql"].lstrip().startswith("SELECT") for query in queries] == [True, True]
    todo, _ = Todo.objects.create_todo(kind="k", event=known.pk)
    assert todo.event_id == known.pk


def test_an_exception_whose_str_raises_is_a_typed_error(db: None) -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    with pytest.raises(InvalidTodo, match="str\\(\\) raised RuntimeError"):
        Todo.objects.fail("td_x", "w1", Unprintable())


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ({"path": "caf\u00e9 \U0001f600"}, True),  # non-ASCII and astral text is fine
        ({"text": "\\u0000 is how JSON writes NUL"}, True),  # a backslash, not a NUL
        ({"text": "\x00"}, False),
        (nested(validation.MAX_JSON_DEPTH - 1), True),  # stored as payload {"value": ...}
        ({"brackets": "[" * 500}, True),  # brackets inside strings do not nest
        ([[1]] * 300, True),  # many arrays, nested two deep
    ],
)
def test_json_values_near_the_rules(db: None, value: Any, stored: bool) -> None:
    """The JSON checks refuse what PostgreSQL or the loader would, and nothing else."""
    if not stored:
        with pytest.raises(InvalidTodo):
            validation.json_text(value, "result")
        return
    todo = Todo.objects.create_todo(kind="k", payload={"value": value})[0]
    todo.refresh_from_db()
    assert todo.payload == {"value": value}


def test_the_whitespace_class_is_what_str_isspace_calls_whitespace() -> None:
    """The class the API's schema states blank text with (api/schemas.py) is the core's."""
    whitespace = re.compile(f"[{validation.WHITESPACE}]")
    everything = map(chr, range(0x110000))
    assert [char for char in everything if whitespace.fullmatch(char)] == [
        char for char in map(chr, range(0x110000)) if char.isspace()
    ]


@pytest.mark.parametrize(
    ("run_after", "stored"),
    [
        (datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))), None),
        (
            datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=1))),
            datetime.max.replace(tzinfo=UTC),
        ),
    ],
)
def test_a_run_after_beyond_the_years_python_holds_is_the_first_or_last_moment(
    db: None, run_after: datetime, stored: datetime | None
) -> None:
    """In UTC it would be year 0 or 10000: stored as such, the todo could not be read back."""
    todo, _ = Todo.objects.create_todo(queue="q", kind="k", run_after=run_after)
    assert Todo.objects.get(pk=todo.pk).next_retry_at == stored


def test_the_json_size_limit_counts_utf8_bytes(settings: Any) -> None:
    """MAX_JSON_BYTES is in bytes: two-byte characters count twice."""
    settings.SWITCHBOARD_TODOS_MAX_JSON_BYTES = 20
    assert validation.json_text("é" * 8, "result")  # 18 bytes with the quotes
    with pytest.raises(InvalidTodo, match="is 20 bytes as JSON|is 22 bytes as JSON"):
        validation.json_text("é" * 10, "result")


def test_the_async_claim_validates_through_the_same_path() -> None:
    """aclaim_batch (its own code, for the blocking wait) refuses before it awaits anything."""
    with pytest.raises(InvalidTodo, match="owner contains an unpaired"):
        asyncio.run(Todo.objects.aclaim_batch("q", LONE, 10, 1))


# The property: arbitrary text and JSON at every public method.

#: Text that once reached the database: lone surrogates, NUL, blank, overlong.
NASTY_TEXT = ["\ud800", LONE, "\udfff\ud800", "td\x00", "", "  ", "\n", "x" * 1001]
#: Any text at all: surrogates, NUL and every other control character included.
ANY_TEXT = st.sampled_from(NASTY_TEXT) | st.text(st.characters(exclude_categories=()), max_size=12)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(ANY_TEXT, children, max_size=3)
    ),
    max_leaves=8,
)
HOSTILE = st.one_of(
    ANY_TEXT,
    JSON,
    st.integers(min_value=2, max_value=3000).map(nested),
    st.lists(ANY_TEXT, max_size=3),
    st.binary(max_size=4),
    st.builds(object),
    st.timedeltas(),
    st.floats(),
)

#: The todos the fixture makes, one per state, all held by (or for) owner "w1".
IDS = [f"td_{state}" for state in State.values]
TODO_ID = st.sampled_from(IDS)
SECONDS = st.sampled_from([30, 0.5, timedelta(minutes=1)])
SPEC = st.fixed_dictionaries(
    {},
    optional={
        name: st.sampled_from([default, "k", "q", "ev_known"]) | HOSTILE
        for name, default in {**validation.CREATION_DEFAULTS, "colour": None}.items()
    },
)
SPECS = st.lists(SPEC, max_size=3)
#: A blocking claim must not block: no wait, or a refused one.
WAIT = st.sampled_from([None, 0])
HOSTILE_WAIT = st.sampled_from([-1, float("nan"), 10**9, "1", LONE, [1]])

#: Every public method of the manager (the async twins run the same code): per argument, a
#: usable value; the property makes one argument of each call hostile.
METHODS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "create_todo": {
        name: st.sampled_from([default, "k", "q", "ev_known"])
        for name, default in validation.CREATION_DEFAULTS.items()
    },
    "create_many": {"todos": SPECS},
    "enqueue_many": {"todos": SPECS},
    "claim_next": {
        "queues": st.just("q"),
        "owner": st.just("w1"),
        "ttl": SECONDS,
        "wait": WAIT,
        "max_held": st.none() | st.integers(0, 3),
    },
    "claim_batch": {
        "queues": st.just(["q"]),
        "owner": st.just("w1"),
        "ttl": SECONDS,
        "limit": st.integers(1, 3),
        "wait": WAIT,
        "max_held": st.none() | st.integers(0, 3),
    },
    "claim": {"todo_id": TODO_ID, "owner": st.just("w1"), "ttl": SECONDS},
    "wait_for": {"todo_id": TODO_ID, "timeout": st.just(0) | st.just(0.01)},
    "heartbeat": {
        "todo_id": TODO_ID,
        "owner": st.just("w1"),
        "ttl": SECONDS,
        "progress": st.none() | JSON,
    },
    "heartbeat_many": {
        "owner": st.just("w1"),
        "ttl": SECONDS,
        "todo_ids": st.lists(TODO_ID, min_size=1, max_size=3),
        "progress": st.none() | st.dictionaries(TODO_ID, JSON),
    },
    "complete": {"todo_id": TODO_ID, "owner": st.just("w1"), "result": JSON},
    "complete_many": {"owner": st.just("w1"), "results": st.dictionaries(TODO_ID, JSON)},
    "fail": {
        "todo_id": TODO_ID,
        "owner": st.just("w1"),
        "error": JSON | st.builds(ValueError, ANY_TEXT),
        "retry_in": st.none() | SECONDS,
    },
    "release": {"todo_id": TODO_ID, "owner": st.just("w1"), "delay": st.none() | SECONDS},
    "reap_expired": {},
    "requeue": {"todo_id": TODO_ID},
    "requeue_many": {"todo_ids": st.lists(TODO_ID, min_size=1, max_size=3)},
    "expire_lease": {"todo_id": TODO_ID},
    "expire_lease_many": {"todo_ids": st.lists(TODO_ID, min_size=1, max_size=3)},
    "cancel": {"todo_id": TODO_ID, "reason": st.just("stop")},
    "cancel_many": {
        "todo_ids": st.lists(TODO_ID, min_size=1, max_size=3),
        "reason": st.just("stop"),
    },
    "set_priority": {"todo_id": TODO_ID, "priority": st.integers(-100, 100)},
    "claim_filtered": {
        "queryset": st.sampled_from([Todo.objects.filter(queue="q"), Todo.objects.all()]),
        "owner": st.just("w1"),
        "ttl": SECONDS,
        "limit": st.integers(1, 3),
    },
    # A schedule that is not in the table: a tick is refused or finds nothing to advance.
    "tick_schedule": {
        "schedule": st.just("nightly"),
        "awaited": st.just(datetime(2026, 1, 1, tzinfo=UTC)),
        "tick": st.just(datetime(2026, 1, 1, tzinfo=UTC)),
        "next_run_at": st.just(datetime(2026, 1, 2, tzinfo=UTC)),
        "enqueue": st.booleans(),
    },
    "set_priority_many": {
        "todo_ids": st.lists(TODO_ID, min_size=1, max_size=3),
        "priority": st.integers(-100, 100),
    },
}
#: Event.objects' own methods, held to the same property.
EVENT_METHODS: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "record": {
        "source": st.just("github"),
        "kind": st.just("push"),
        "payload": st.dictionaries(ANY_TEXT, JSON, max_size=3),
        "delivery_id": st.sampled_from([None, "d-1", "d-2"]),
    },
}
#: Hostile values that need a shape of their own: ids inside collections, waits that block.
HOSTILE_FOR = {
    "todos": st.lists(SPEC, max_size=3) | HOSTILE,
    "results": st.dictionaries(ANY_TEXT | st.integers(), JSON) | HOSTILE,
    "todo_ids": st.lists(ANY_TEXT | TODO_ID | st.integers(), max_size=3) | HOSTILE,
    "queues": st.lists(ANY_TEXT, max_size=2) | HOSTILE,
    "wait": HOSTILE_WAIT,
}


def public_methods(manager: type) -> set[str]:
    """The methods a manager adds to Django's."""
    return {
        name
        for name, member in vars(manager).items()
        if not name.startswith("_") and callable(member)
    }


@pytest.mark.parametrize(
    ("manager", "methods"), [(TodoManager, METHODS), (EventManager, EVENT_METHODS)]
)
def test_the_property_covers_every_public_method(
    manager: type, methods: dict[str, dict[str, Any]]
) -> None:
    """A new method must join the property (or be the async twin of one), with every argument."""
    for name in public_methods(manager):
        sync_name = name[1:] if name.startswith("a") and name[1:] in methods else name
        assert sync_name in methods, f"{name} is not exercised by the property test"
        parameters = inspect.signature(getattr(manager, sync_name)).parameters
        assert set(parameters) - {"self"} == set(methods[sync_name]), sync_name


def table_state() -> tuple[Any, ...]:
    """Everything in both tables, as one comparable value."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT (SELECT count(*) FROM todos), (SELECT md5(string_agg(t::text, ',' ORDER BY id))"
            " FROM todos t), (SELECT count(*) FROM events)"
        )
        row = cursor.fetchone()
    assert row is not None
    return tuple(row)


@pytest.fixture
def one_todo_per_state(make_todo: MakeTodo) -> Iterator[None]:
    Event.objects.create(id="ev_known", source="s")
    for todo_id in IDS:
        state = todo_id.removeprefix("td_")
        make_todo(id=todo_id, state=state, queue="q", owner="w1" if state != "pending" else None)
    yield


@pytest.mark.parametrize("method", [*METHODS, *(f"Event.{name}" for name in EVENT_METHODS)])
@settings(
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def test_any_input_gets_success_or_a_typed_error(
    one_todo_per_state: None, method: str, data: st.DataObject
) -> None:
    """Success, or a TodoError that wrote nothing and ran no write before it was raised."""
    manager, name = (
        (Event.objects, method[6:]) if method.startswith("Event.") else (Todo.objects, method)
    )
    usable = (EVENT_METHODS if manager is Event.objects else METHODS)[name]
    hostile = data.draw(st.sampled_from([*usable, None]), label="hostile argument")
    arguments = {
        name: data.draw(HOSTILE_FOR.get(name, HOSTILE) if name == hostile else strategy, name)
        for name, strategy in usable.items()
    }
    with transaction.atomic():  # each example starts from the fixture's todos
        before = table_state()
        try:
            with CaptureQueriesContext(connection) as queries:
                getattr(manager, name)(**arguments)
        except InvalidTodo:
            assert all(query["sql"].lstrip().startswith("SELECT") for query in queries)
            assert table_state() == before
        except TodoError:
            assert table_state() == before
        transaction.set_rollback(True)
