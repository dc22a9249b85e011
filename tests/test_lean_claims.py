"""The lean claim (claim_ready, sql/claiming.sql): chosen for each call, never wrong.

Each test is a running claimer that has claimed lean; a fact changes, committed (by an
operator, a producer); and the claimer's next claim honours it, in as many statements as it
says: a claim of a queue known to be paused or limited sends claim_turn ahead of the full
statement, in the same round trip.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from switchboard_todos.claims.marks import marks
from switchboard_todos.models import Queue, State, Todo

#: How the lean statement's text begins; the full one's begins otherwise.
LEAN = "-- claim_next, lean"

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def running_claimer() -> Iterator[None]:
    """This process as a claimer past its first claim, a full scan (claims/marks.py)."""
    marks.forget()
    assert Todo.objects.claim_next("warm-up", "w0", 30) is None
    yield
    marks.forget()


#: How the lean claim of one todo (claim_one) begins; claim_ready's begins otherwise.
LEAN_ONE = "-- claim_next, lean, of one todo"
#: How claim_turn begins, the wait for a limited queue's row sent ahead of the full claim.
TURN = "-- Wait for a claim's turn"


def ran(statements: CaptureQueriesContext, *, one: bool = False) -> list[str]:
    """Which statements ran: "lean" (claim_ready, or claim_one unless `one` tells it apart as
    "one"), "turn" (claim_turn) or "full"."""
    starts = (("one", LEAN_ONE),) * one + (("lean", LEAN), ("turn", TURN))
    return [
        next((name for name, start in starts if q["sql"].startswith(start)), "full")
        for q in statements
    ]


def claim(queue: str = "q", limit: int = 1) -> tuple[list[Todo], list[str]]:
    """Claim from `queue` for w1; the todos, and which statements ran (ran)."""
    with CaptureQueriesContext(connection) as statements:
        todos = Todo.objects.claim_batch(queue, "w1", 30, limit)
    return todos, ran(statements)


def create(count: int = 1, **fields: Any) -> list[Todo]:
    return [Todo.objects.create_todo(queue="q", kind="k", **fields)[0] for _ in range(count)]


def test_a_claim_of_a_queue_nothing_limits_is_one_lean_statement() -> None:
    first, second = create(2)
    assert claim() == ([first], ["lean"])
    assert claim() == ([second], ["lean"])
    assert claim() == ([], ["lean"])


def test_a_pause_stops_the_next_claim_and_a_resume_lets_the_one_after_through() -> None:
    """The lean claim that meets the pause claims nothing and the full one runs; the next
    claims go straight to the full statement until one finds the queue free again."""
    todos = create(4)
    assert claim() == ([todos[0]], ["lean"])
    Queue.objects.create(name="q", paused=True)
    assert claim() == ([], ["lean", "turn", "full"])
    assert claim() == ([], ["turn", "full"])
    Queue.objects.filter(name="q").update(paused=False)
    assert claim() == ([todos[1]], ["turn", "full"])
    assert claim() == ([todos[2]], ["lean"])


def test_a_concurrency_limit_set_under_the_claimer_gives_out_its_slots_only() -> None:
    """The todos claimed before the limit hold no slot (docs/queues.md); from the next claim
    on, no more than the limit take one."""
    todos = create(5)
    assert claim() == ([todos[0]], ["lean"])
    Queue.objects.create(name="q", concurrency_limit=2)
    assert claim(limit=5) == (todos[1:3], ["lean", "turn", "full"])
    assert claim(limit=5) == ([], ["turn", "full"])
    assert [todo.slot for todo in Todo.objects.filter(state=State.CLAIMED).order_by("slot")] == [
        1,
        2,
        None,
    ]


def test_a_rate_limit_set_under_the_claimer_is_counted_from_its_next_claim() -> None:
    todos = create(4)
    assert claim() == ([todos[0]], ["lean"])
    Queue.objects.create(name="q", rate_limit=2, rate_period=timedelta(hours=1))
    assert claim(limit=5)[0] == todos[1:3]
    assert claim() == ([], ["turn", "full"])


def test_a_concurrency_key_is_held_by_a_lean_claim_too() -> None:
    """Two todos of one key: the lean claim takes the first, and not the second while the
    first is held; both statements keep the key's order."""
    first, second = create(2, concurrency_key="account-7")
    other = create()[0]
    assert claim(limit=5) == ([first, other], ["lean"])
    assert claim(limit=5) == ([], ["lean"])
    Todo.objects.complete(first.id, "w1")
    assert claim(limit=5) == ([second], ["lean"])


def test_a_blocked_child_waits_for_its_parent_and_is_claimed_lean_after() -> None:
    parent = create()[0]
    child = create(after=[parent.id])[0]
    assert claim(limit=5) == ([parent], ["lean"])
    assert claim(limit=5) == ([], ["lean"])
    Todo.objects.complete(parent.id, "w1")
    assert claim(limit=5) == ([child], ["lean"])


def test_a_first_fair_key_takes_its_turn_in_a_lean_claim() -> None:
    """A quiet key's first todo, created behind a backlog of another key, is claimed within
    the next round of turns, not behind the backlog."""
    backlog = create(20, fair_key="noisy")
    assert claim() == ([backlog[0]], ["lean"])
    quiet = create(fair_key="quiet")[0]
    claimed, statements = claim(limit=2)
    assert quiet in claimed
    assert statements == ["lean"]


def test_max_held_bounds_a_lean_claim() -> None:
    create(5)
    with CaptureQueriesContext(connection) as statements:
        held = Todo.objects.claim_batch("q", "w1", 30, 5, max_held=2)
    assert len(held) == 2
    assert [q["sql"].startswith(LEAN) for q in statements] == [True]
    assert Todo.objects.claim_batch("q", "w1", 30, 5, max_held=2) == []


def claim_next(queue: str = "q") -> tuple[Todo | None, list[str]]:
    """claim_next from `queue` for w1; the todo, and which statements ran (ran, claim_one
    told apart)."""
    with CaptureQueriesContext(connection) as statements:
        todo = Todo.objects.claim_next(queue, "w1", 30)
    return todo, ran(statements, one=True)


def test_a_claim_of_one_runs_claim_one_and_a_concurrency_limit_sends_it_to_the_full_claim() -> None:
    todos = create(3)
    assert claim_next() == (todos[0], ["one"])
    Queue.objects.create(name="q", concurrency_limit=2)
    claimed, statements = claim_next()
    assert (claimed, statements) == (todos[1], ["one", "turn", "full"])
    assert claimed is not None and claimed.slot is not None
    assert claim_next() == (todos[2], ["turn", "full"])


def test_a_claim_of_one_keeps_a_concurrency_key_held_and_in_order() -> None:
    first, second = create(2, concurrency_key="account-7")
    other = create()[0]
    assert claim_next() == (first, ["one"])
    assert claim_next() == (other, ["one"])  # the key is held: its second todo waits
    assert claim_next() == (None, ["one"])
    Todo.objects.complete(first.id, "w1")
    assert claim_next() == (second, ["one"])


def test_a_claim_of_one_takes_priority_then_turn_then_a_due_retry_at_its_turn() -> None:
    """A higher priority created last goes first; a retry that fell due ranks at its turn,
    ahead of ready todos created after it; a todo assigned to another owner is passed over."""
    assigned = create(assignee="w9")[0]
    retried = create()[0]
    assert claim_next() == (retried, ["one"])
    Todo.objects.fail(retried.id, "w1", "flaky", retry_in=0)
    later = create()[0]
    urgent = create(priority=5)[0]
    assert claim_next() == (urgent, ["one"])
    assert claim_next() == (retried, ["one"])
    assert claim_next() == (later, ["one"])
    assert claim_next() == (None, ["one"])
    assert Todo.objects.get(pk=assigned.pk).state == State.PENDING


def test_a_claim_of_one_honours_max_held_blocked_children_and_fair_turns() -> None:
    parent = create()[0]
    child = create(after=[parent.id])[0]
    assert claim_next() == (parent, ["one"])
    assert claim_next() == (None, ["one"])  # the child waits for its parent
    Todo.objects.complete(parent.id, "w1")
    with CaptureQueriesContext(connection) as statements:
        assert Todo.objects.claim_next("q", "w1", 30, max_held=0) is None
    assert [q["sql"].startswith(LEAN_ONE) for q in statements] == [True]
    assert claim_next() == (child, ["one"])
    noisy = create(5, fair_key="noisy")
    assert claim_next() == (noisy[0], ["one"])
    quiet = create(fair_key="quiet")[0]
    # Level with the head of the backlog, not behind it: one of the next two.
    assert quiet in {claim_next()[0], claim_next()[0]}
