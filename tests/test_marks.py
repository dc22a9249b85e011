"""The claim's low-water marks: dead entries skipped, and no todo behind a mark starves."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from switchboard_todos.marks import FROM_HEAD, FULL_SCAN_EVERY, MARK_SLACK, Marks, marks
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    controlled = Clock()
    monkeypatch.setattr(marks, "clock", controlled)
    yield controlled


def test_a_queue_is_scanned_from_the_head_every_full_scan_interval() -> None:
    clock = Clock()
    own = Marks(clock)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert own.for_claim("default", ["a", "b"]) == [FROM_HEAD, FROM_HEAD]  # no mark yet
    own.claimed("default", [("a", at + timedelta(seconds=5)), ("a", at), ("b", at)])
    assert own.for_claim("default", ["a", "b"]) == [at - MARK_SLACK, at - MARK_SLACK]
    clock.now += FULL_SCAN_EVERY
    assert own.for_claim("default", ["a"]) == [FROM_HEAD]
    assert own.for_claim("default", ["a", "b"]) == [at - MARK_SLACK, FROM_HEAD]
    assert own.for_claim("other", ["a"]) == [FROM_HEAD]  # marks are per database


@pytest.mark.parametrize(
    "behind",
    ["enqueued late with an old created_at", "released", "lower priority"],
)
def test_a_todo_behind_the_mark_is_claimed_within_the_full_scan_interval(
    make_todo: MakeTodo, clock: Clock, behind: str
) -> None:
    """Claims move the mark past the todo; within FULL_SCAN_EVERY a claim finds it anyway."""
    if behind == "lower priority":
        passed_over = make_todo(priority=-1, created_ago=timedelta(minutes=1))
        make_todo(priority=5)
    else:
        make_todo()
    first = Todo.objects.claim_next("default", "w1", 30)  # a full scan: it sets the mark
    assert first is not None
    if behind == "enqueued late with an old created_at":
        passed_over = make_todo(created_ago=timedelta(hours=1))
    elif behind == "released":
        passed_over = make_todo(created_ago=timedelta(hours=1), state=State.CLAIMED)
        Todo.objects.release(passed_over.id, "w1")
    assert Todo.objects.claim_next("default", "w1", 30) is None  # behind the mark, for now
    clock.now += FULL_SCAN_EVERY
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == passed_over.id
