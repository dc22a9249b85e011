"""Event.objects.record: an inbound delivery stored once, however often it comes."""

from __future__ import annotations

from typing import Any

import pytest
from pytest_django import DjangoAssertNumQueries

from switchboard_todos.exceptions import InvalidTodo
from switchboard_todos.models import Event
from tests.conftest import run_in_threads

PUSH = {"ref": "refs/heads/main", "commits": [{"message": "Fix the thing"}]}


@pytest.mark.django_db
def test_a_new_delivery_is_one_insert(django_assert_num_queries: DjangoAssertNumQueries) -> None:
    """The row as the database made it: its id, its clock, the payload as given."""
    with django_assert_num_queries(1):
        event, created = Event.objects.record(
            source="github", kind="push", payload=PUSH, delivery_id="d-1"
        )
    assert created is True
    assert event.id.startswith("ev_")
    assert event.received_at is not None
    assert (event.source, event.kind, event.payload, event.delivery_id) == (
        "github",
        "push",
        PUSH,
        "d-1",
    )
    assert Event.objects.get() == event


@pytest.mark.django_db
def test_a_repeat_returns_the_stored_event_and_writes_nothing(
    django_assert_num_queries: DjangoAssertNumQueries,
) -> None:
    """Same source and delivery id: the first copy, as stored, even with another body."""
    first, _ = Event.objects.record(source="github", kind="push", payload=PUSH, delivery_id="d-1")
    with django_assert_num_queries(2):
        again, created = Event.objects.record(
            source="github", kind="push", payload={"other": True}, delivery_id="d-1"
        )
    assert created is False
    assert (again.id, again.payload) == (first.id, PUSH)
    assert Event.objects.count() == 1


@pytest.mark.django_db
def test_delivery_ids_are_scoped_by_source_and_optional() -> None:
    """Another source's id is another delivery; without an id, every call stores an event."""
    Event.objects.record(source="github", delivery_id="42")
    _, other_source = Event.objects.record(source="shop", delivery_id="42")
    _, first = Event.objects.record(source="github")
    _, second = Event.objects.record(source="github")
    assert (other_source, first, second) == (True, True, True)
    assert Event.objects.count() == 4


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        pytest.param({"source": 7}, "source must be a str", id="source-not-str"),
        pytest.param({"kind": "x" * 201}, "kind is 201 characters", id="kind-too-long"),
        pytest.param({"payload": [1]}, "payload must be a dict", id="payload-not-dict"),
        pytest.param({"payload": {"a": "\x00"}}, "NUL characters", id="payload-nul"),
        pytest.param({"delivery_id": " "}, "delivery_id must not be empty", id="blank-id"),
        pytest.param({"delivery_id": "k" * 256}, "delivery_id is 256", id="id-too-long"),
    ],
)
@pytest.mark.django_db
def test_bad_input_is_refused_before_any_statement(
    django_assert_num_queries: DjangoAssertNumQueries, fields: dict[str, Any], message: str
) -> None:
    with django_assert_num_queries(0), pytest.raises(InvalidTodo, match=message):
        Event.objects.record(**{"source": "github", **fields})


@pytest.mark.django_db(transaction=True)
def test_concurrent_copies_store_one_event() -> None:
    """Eight copies racing on their own connections: one stored, every caller gets it."""
    answers = run_in_threads(
        8, lambda index: Event.objects.record(source="github", delivery_id="race-1")
    )
    assert sorted(created for _, created in answers) == [False] * 7 + [True]
    assert {event.id for event, _ in answers} == {Event.objects.get().id}
