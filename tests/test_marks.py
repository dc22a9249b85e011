"""The claim's low-water marks: dead entries skipped, and no todo behind a mark starves."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connections, transaction

from switchboard_todos.claims.marks import (
    BELOW_ALL,
    FROM_HEAD,
    FULL_SCAN_EVERY,
    MARK_SLACK,
    MARK_TRAIL,
    NO_QUEUE,
    ClaimMarks,
    Marks,
    marks,
)
from switchboard_todos.cursors import array_literal
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo

pytestmark = pytest.mark.django_db
HOUR = timedelta(hours=1)


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


def test_a_full_scan_every_interval_and_marks_between() -> None:
    clock = Clock()
    own = Marks(clock)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    none = ([NO_QUEUE], [BELOW_ALL], [FROM_HEAD])
    head = ClaimMarks([FROM_HEAD, FROM_HEAD], [BELOW_ALL] * 2, [BELOW_ALL] * 2, *none, True)
    assert own.for_claim("default", ["a", "b"]) == head  # the first
    own.claimed("default", [("a", 0, at + timedelta(seconds=5)), ("a", 0, at), ("a", 7, at + HOUR)])
    assert own.for_claim("default", ["a", "b"]) == ClaimMarks(
        marks=[at - MARK_SLACK, FROM_HEAD],
        tops=[7, BELOW_ALL],
        bottoms=[0, BELOW_ALL],
        group_queues=[NO_QUEUE, "a", "a"],
        group_priorities=[BELOW_ALL, 7, 0],
        group_marks=[FROM_HEAD, at + HOUR - MARK_SLACK, at - MARK_SLACK],
        full_scan=False,
    )
    clock.now += FULL_SCAN_EVERY
    assert own.for_claim("default", ["a"]).full_scan
    assert own.for_claim("default", ["a"]).group_priorities == [BELOW_ALL, 7, 0]
    assert own.for_claim("other", ["a"]).full_scan  # marks are per database


def test_a_new_priority_above_or_below_the_known_ones_is_claimed_at_once(
    make_todo: MakeTodo, clock: Clock
) -> None:
    """Priorities this process has no mark for are scanned from the queue's mark, above the
    highest it knows and below the lowest: a new urgent todo does not wait for a full scan."""
    make_todo(priority=0)
    make_todo(priority=0)
    assert Todo.objects.claim_next("default", "w1", 30) is not None  # full scan: marks 0
    urgent = make_todo(priority=50)
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == urgent.id
    assert Todo.objects.claim_next("default", "w1", 30) is not None  # the second priority 0
    minor = make_todo(priority=-50)
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == minor.id


def test_a_new_priority_between_known_ones_waits_for_the_full_scan(
    make_todo: MakeTodo, clock: Clock
) -> None:
    make_todo(priority=10)
    make_todo(priority=-10)
    assert len(Todo.objects.claim_batch("default", "w1", 30, 2)) == 2  # full scan: marks 10, -10
    between = make_todo(priority=0)
    assert Todo.objects.claim_next("default", "w1", 30) is None
    clock.now += FULL_SCAN_EVERY
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == between.id


@pytest.mark.parametrize(
    "behind",
    ["enqueued late with an old created_at", "requeued", "lower priority", "lapsed"],
)
def test_a_todo_behind_the_mark_is_claimed_by_the_next_full_scan(
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
    elif behind == "requeued":
        passed_over = make_todo(created_ago=timedelta(hours=1), state=State.FAILED)
        Todo.objects.requeue(passed_over.id)
    elif behind == "lapsed":
        passed_over = make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5))
    assert Todo.objects.claim_next("default", "w1", 30) is None  # behind the mark, for now
    clock.now += FULL_SCAN_EVERY
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == passed_over.id


def test_a_released_todo_is_claimable_at_once_whatever_the_mark(
    make_todo: MakeTodo, clock: Clock
) -> None:
    make_todo()
    assert Todo.objects.claim_next("default", "w1", 30) is not None  # sets the mark
    held = make_todo(created_ago=timedelta(hours=1), state=State.CLAIMED)
    Todo.objects.release(held.id, "w1")
    again = Todo.objects.claim_next("default", "w1", 30)
    assert again is not None and again.id == held.id


def test_a_todo_created_after_a_keyed_backlog_ran_ahead_is_claimed_at_once(clock: Clock) -> None:
    """Reproduction: 10,000 todos of one fair key take turns up to 10 s ahead of the clock, and
    the marks of the claims that drain them follow. A todo created next takes its creation time
    as its turn, behind those marks, and waited for the next full scan (up to 10 s: the quiet
    keys' dwell of the fair_queue scenario, 3.3 s at p50, came from it). The claim that came
    back short brings the marks down to the claims' time."""
    Todo.objects.enqueue_many({"kind": "k", "fair_key": "burst"} for _ in range(10_000))
    drained = 0
    while batch := Todo.objects.claim_batch("default", "w1", 30, 1000):
        drained += len(batch)
    assert drained == 10_000
    late, _ = Todo.objects.create_todo(kind="k")
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == late.id


def test_a_mark_trails_the_claims_that_move_it() -> None:
    """The lowest mark set within MARK_TRAIL (and the last one before it) is the mark."""
    clock = Clock()
    own = Marks(clock)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert own.for_claim("default", ["a"]).full_scan  # the first: the next ones read the marks
    for second in range(5):  # a drain passing 10 s of turns each 0.2 s
        own.claimed("default", [("a", 0, at + timedelta(seconds=10 * second))])
        clock.now += MARK_TRAIL / 2.5
    assert (
        own.for_claim("default", ["a"]).group_marks[-1] == at + timedelta(seconds=10) - MARK_SLACK
    )
    own.claimed("default", [("a", 0, at)])  # a lower one wins at once
    assert own.for_claim("default", ["a"]).group_marks[-1] == at - MARK_SLACK
    clock.now += MARK_TRAIL
    own.claimed("default", [("a", 0, at + HOUR)])
    assert own.for_claim("default", ["a"]).group_marks[-1] == at - MARK_SLACK
    clock.now += MARK_TRAIL
    own.claimed("default", [("a", 0, at + 2 * HOUR)])
    assert own.for_claim("default", ["a"]).group_marks[-1] == at + HOUR - MARK_SLACK


@pytest.mark.django_db(transaction=True)
def test_a_quiet_key_s_todo_committed_after_claims_passed_its_turn_is_claimed_next(
    clock: Clock,
) -> None:
    """Reproduction: a create reads the head's turn, and claims of the backlog move past it by
    more than MARK_SLACK before it commits (a fast drain: the fair_queue scenario). Its todo
    was behind the mark, and the quiet keys' todos created next took the same turn: they
    waited for the next full scan, or the backlog's end. The mark trails the claims now."""
    Todo.objects.enqueue_many({"kind": "k", "fair_key": "noisy"} for _ in range(5000))
    assert len(Todo.objects.claim_batch("default", "w1", 30, 100)) == 100
    read, commit, quiet = threading.Event(), threading.Event(), {}

    def create() -> None:
        try:
            with transaction.atomic():
                quiet["todo"], _ = Todo.objects.create_todo(kind="k", fair_key="quiet")
                read.set()
                assert commit.wait(30)
        finally:
            connections.close_all()

    creator = threading.Thread(target=create)
    creator.start()
    assert read.wait(30)
    for _ in range(3):  # 3 s of the backlog's turns, past the quiet todo's
        assert len(Todo.objects.claim_batch("default", "w1", 30, 1000)) == 1000
    commit.set()
    creator.join(30)
    found = Todo.objects.claim_next("default", "w1", 30)
    assert found is not None and found.id == quiet["todo"].id


def test_the_claims_parameters_are_the_arrays_text_forms() -> None:
    """ClaimMarks.params builds each array for its one type: the same text as
    cursors.array_literal gives."""
    at = datetime(2026, 1, 1, 12, 30, 1, 5, tzinfo=UTC)
    found = ClaimMarks(
        marks=[at, FROM_HEAD, datetime.min.replace(tzinfo=UTC)],
        tops=[7, BELOW_ALL, -100],
        bottoms=[0, BELOW_ALL, 100],
        group_queues=[NO_QUEUE, 'a "b"', "c\\d"],
        group_priorities=[BELOW_ALL, 7, 0],
        group_marks=[FROM_HEAD, at + HOUR, at],
        full_scan=False,
    )
    assert found.params() == {
        **{
            name: array_literal(value)
            for name, value in found._asdict().items()
            if name != "full_scan"
        },
        "full_scan": False,
    }
