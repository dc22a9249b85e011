"""Dependencies as rows of todo_edges (issue 35): a child names its parents without writing or
locking them, so a parent of many children costs each new one what the first cost, and its
claims never wait; the race this leaves (a child created while its parent ends) is repaired by
repair_blocked, which the reaper runs at every sweep, exactly once."""

from __future__ import annotations

import threading
from datetime import timedelta
from importlib import import_module
from typing import Any

import psycopg
import pytest
from django.core.management import call_command
from django.db import connection, connections, transaction

from switchboard_todos.claims.listen import CHANNEL
from switchboard_todos.models import State, Todo, TodoEdge
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.upkeep import retention
from switchboard_todos.upkeep.reaper import Reaper
from tests.conftest import database_url, run_in_threads
from tests.helpers import MakeTodo, db_now, own_wal

pytestmark = pytest.mark.django_db

#: Parents every child of the WAL test names, and the child measured against the first.
SHARED_PARENTS = 1000
LATER_CHILD = 200
#: Children measured at each end, the least of each kept (a checkpoint's full-page images
#: would otherwise make one of them look dear).
MEASURED = 5


def parents(count: int) -> list[str]:
    made = Todo.objects.create_many([{"kind": "parent"} for _ in range(count)])
    return [todo.id for todo, _ in made]


def child_of(ids: list[str], **fields: Any) -> Todo:
    todo, created = Todo.objects.create_todo(kind="child", after=ids, **fields)
    assert created
    return todo


def wal_of_a_child(ids: list[str]) -> int:
    """Bytes of WAL written while one child of `ids` is created (helpers.own_wal)."""
    return own_wal(lambda: child_of(ids))


def rows_of(ids: list[str]) -> list[tuple[str, str]]:
    """Each todo's place and the transaction that wrote it: both change when a row is
    rewritten (or locked: a lock writes xmax, not xmin, so xmax is read too)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT ctid::text, xmin::text || '/' || xmax::text FROM todos"
            " WHERE id = ANY (%s) ORDER BY id",
            [ids],
        )
        return list(cursor.fetchall())


@pytest.mark.django_db(transaction=True)
def test_the_200th_child_of_1000_parents_writes_what_the_first_did() -> None:
    """WAL per create no longer grows with the children a parent already has (it rewrote the
    parent's array: 0.78 MB for the first child of 1,000 parents, 28.3 MB for the 600th). 200
    children here, not 600, to keep the test short: the growth was linear, so at 2x the 200th
    would have written some 9 MB, twelve times the first. A checkpoint comes before the later
    children, as one may in any run (CI's other leg writes too): their first changes to each
    page then carry its full image, which is not theirs to count (helpers.own_wal)."""
    ids = parents(SHARED_PARENTS)
    before = rows_of(ids)
    first = min(wal_of_a_child(ids) for _ in range(MEASURED))
    for _ in range(LATER_CHILD - 2 * MEASURED):
        child_of(ids)
    with connection.cursor() as cursor:
        cursor.execute("CHECKPOINT")
    later = min(wal_of_a_child(ids) for _ in range(MEASURED))
    assert later < 2 * first, (first, later)
    assert rows_of(ids) == before  # no parent rewritten or locked
    assert TodoEdge.objects.count() == SHARED_PARENTS * LATER_CHILD


@pytest.mark.django_db(transaction=True)
def test_a_child_being_created_holds_no_lock_on_its_parents() -> None:
    """While the transaction creating a child of 1,000 parents is open, another session claims
    every parent with a lock timeout of 50 ms: the creator holds no lock on any of them."""
    ids = parents(SHARED_PARENTS)
    claimed: list[Todo] = []

    def claim_them() -> None:
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL lock_timeout = '50ms'")
                claimed.extend(Todo.objects.claim(todo_id, "w1", 60) for todo_id in ids)
        finally:
            connections.close_all()

    with transaction.atomic():
        child = child_of(ids)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT mode FROM pg_locks WHERE pid = pg_backend_pid()"
                " AND relation = 'todos'::regclass"
            )
            modes = {mode for (mode,) in cursor.fetchall()}
        assert "RowShareLock" not in modes  # no SELECT ... FOR UPDATE of the parents
        claimer = threading.Thread(target=claim_them)
        claimer.start()
        claimer.join(60)
    assert [todo.id for todo in claimed] == ids
    assert Todo.objects.get(pk=child.id).waiting_for == SHARED_PARENTS


@pytest.mark.django_db(transaction=True)
def test_claims_of_parents_take_them_while_children_are_created_in_a_loop() -> None:
    """One thread creates children of 100 parents in a loop; another claims the parents one
    by one with lock_timeout 50 ms, and gets each at the first try."""
    ids = parents(100)
    stop = threading.Event()
    made = []

    def create_children() -> None:
        try:
            while not stop.is_set():
                made.append(child_of(ids))
        finally:
            connections.close_all()

    creator = threading.Thread(target=create_children)
    creator.start()
    try:
        while len(made) < 3:
            threading.Event().wait(0.01)
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '50ms'")
        try:
            claimed = [Todo.objects.claim(todo_id, "w1", 60) for todo_id in ids]
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        during = len(made)
    finally:
        stop.set()
        creator.join(60)
    assert [todo.id for todo in claimed] == ids
    assert during > 3  # the creates went on meanwhile


@pytest.mark.django_db(transaction=True)
def test_parents_completing_at_once_unblock_their_child_exactly_once() -> None:
    """Eight parents of one child completed by eight sessions at once: the child counts down to
    zero exactly (each decrement under its row lock), and one of eight claims takes it."""
    ids = parents(8)
    for number, todo_id in enumerate(ids):
        Todo.objects.claim(todo_id, f"w{number}", 60)
    child = child_of(ids)
    run_in_threads(8, lambda n: Todo.objects.complete(ids[n], f"w{n}"))
    assert Todo.objects.get(pk=child.id).waiting_for == 0
    takers = run_in_threads(8, lambda n: Todo.objects.claim_next("default", f"c{n}", 60))
    assert [todo.id for todo in takers if todo is not None] == [child.id]
    assert sum(Todo.objects.repair_blocked()) == 0


def racing_child(parent: Todo, end: Any, *others: Todo, **fields: Any) -> Todo:
    """A child of `parent` (and `others`) created in a transaction held open while another
    session ends the parent (`end(parent)`): the child's snapshot saw the parent not ended, the
    end's snapshot did not see the child. Committed, it is stuck: it counts a parent that is
    over."""
    ended = threading.Event()

    def end_it() -> None:
        try:
            end(parent)
            ended.set()
        finally:
            connections.close_all()

    with transaction.atomic():
        child = child_of([parent.id, *(other.id for other in others)], **fields)
        ender = threading.Thread(target=end_it)
        ender.start()
        ender.join(30)
        assert ended.is_set()  # without waiting for this transaction
    return Todo.objects.get(pk=child.id)


def claimed_parent() -> Todo:
    parent, _ = Todo.objects.create_todo(kind="parent", max_attempts=1)
    claimed = Todo.objects.claim(parent.id, "w1", 60)
    assert claimed is not None
    return claimed


def complete(parent: Todo) -> None:
    Todo.objects.complete(parent.id, "w1")


def fail(parent: Todo) -> None:
    Todo.objects.fail(parent.id, "w1", "broken")


@pytest.mark.django_db(transaction=True)
def test_a_child_created_while_its_parent_completes_is_repaired_once() -> None:
    """The race, for real: stuck after the commit, unblocked (and its queue notified) by the
    repair, and by it alone once (a second repair finds nothing; one claim takes the child)."""
    parent = claimed_parent()
    child = racing_child(parent, complete)
    assert Todo.objects.get(pk=parent.id).state == State.DONE
    assert (child.waiting_for, child.blocked) == (1, True)
    assert Todo.objects.claim_next("default", "w2", 60) is None
    with psycopg.connect(database_url(), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        assert Todo.objects.repair_blocked() == (1, 0, 0)
        listener.execute("SELECT 1")  # the notification, sent on commit, has been read
        assert [notify.payload for notify in listener.notifies(timeout=0.05)] == ["default"]
    child = Todo.objects.get(pk=child.id)
    assert (child.waiting_for, child.blocked) == (0, False)
    assert child.next_retry_at is not None and child.next_retry_at <= db_now()
    assert Todo.objects.repair_blocked() == (0, 0, 0)
    assert Todo.objects.claim_next("default", "w2", 60) == child
    assert Todo.objects.claim_next("default", "w3", 60) is None


@pytest.mark.django_db(transaction=True)
def test_the_reapers_next_sweep_repairs_a_raced_child() -> None:
    parent = claimed_parent()
    child = racing_child(parent, complete)
    sweep = Reaper(interval=1, shutdown=Shutdown(), databases=["default"]).sweep()
    assert sweep.repaired == 1
    assert not Todo.objects.get(pk=child.id).blocked
    assert Todo.objects.repair_blocked() == (0, 0, 0)


@pytest.mark.django_db(transaction=True)
def test_a_raced_child_of_a_parent_that_failed_follows_its_policy() -> None:
    """Cancel (the default): a dead letter naming the parent, and its own child after it, in
    the same repair (one level a statement). Run anyway: unblocked."""
    parent = claimed_parent()
    cancelled = racing_child(parent, fail)
    grandchild = child_of([cancelled.id])
    assert Todo.objects.repair_blocked() == (0, 0, 2)
    cancelled, grandchild = (Todo.objects.get(pk=todo.id) for todo in (cancelled, grandchild))
    assert cancelled.state == grandchild.state == State.FAILED
    assert cancelled.result is not None and grandchild.result is not None
    assert (cancelled.result["parent"], grandchild.result["parent"]) == (parent.id, cancelled.id)
    assert cancelled.errors[-1]["error"]["type"] == "ParentFailed"

    other = claimed_parent()
    spared = racing_child(other, fail, on_parent_failure="run_anyway")
    assert Todo.objects.repair_blocked() == (1, 0, 0)
    assert not Todo.objects.get(pk=spared.id).blocked


@pytest.mark.django_db(transaction=True)
def test_the_repair_recounts_and_leaves_a_child_blocked_by_its_other_parents() -> None:
    parent, other = claimed_parent(), claimed_parent()
    stuck = racing_child(parent, complete, other)
    assert (stuck.waiting_for, stuck.blocked) == (2, True)
    assert Todo.objects.repair_blocked() == (0, 1, 0)
    assert Todo.objects.get(pk=stuck.id).waiting_for == 1
    Todo.objects.complete(other.id, "w1")
    assert not Todo.objects.get(pk=stuck.id).blocked


def test_the_repair_looks_back_as_far_as_it_is_told(make_todo: MakeTodo) -> None:
    """A stale child created before the window is left alone, and found by a wider one."""
    done = make_todo(state=State.DONE)
    old = make_todo(
        kind="child",
        parents=[done.id],
        waiting_for=1,
        next_retry_in=timedelta(days=1),
        created_ago=timedelta(hours=1),
    )
    assert Todo.objects.repair_blocked() == (0, 0, 0)
    assert Todo.objects.repair_blocked(within=timedelta(hours=2)) == (1, 0, 0)
    assert not Todo.objects.get(pk=old.id).blocked


def test_a_purge_deletes_the_edges_of_the_todos_it_deletes(make_todo: MakeTodo) -> None:
    parent = make_todo(state=State.DONE, created_ago=timedelta(days=3))
    child = child_of([parent.id])
    kept = make_todo()
    Todo.objects.filter(pk=child.id).update(state=State.DONE, completed_at=db_now())
    Todo.objects.filter(pk=parent.id).update(completed_at=db_now() - timedelta(days=2))
    other = child_of([kept.id])
    assert retention.purge(timedelta(days=1)).total == 1
    assert list(TodoEdge.objects.values_list("parent_id", "child_id")) == [(kept.id, other.id)]


@pytest.mark.django_db(transaction=True)
def test_the_migration_copies_the_children_arrays_into_edges() -> None:
    """Back to the migration before 0017, children arrays written the old way; forwards, they
    are edges and the column is gone; backwards again, the arrays come back."""
    edges = import_module("switchboard_todos.migrations.0017_todo_edges")
    [previous] = edges.Migration.dependencies
    call_command("migrate", *previous, verbosity=0)
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO todos (id, kind, children) VALUES"
                " ('td_p', 'parent', ARRAY['td_b', 'td_a']), ('td_a', 'child', NULL),"
                " ('td_b', 'child', ARRAY['td_c']), ('td_c', 'grandchild', '{}')"
            )
        call_command("migrate", "switchboard_todos", "0017_todo_edges", verbosity=0)
        assert sorted(TodoEdge.objects.values_list("parent_id", "child_id")) == [
            ("td_b", "td_c"),
            ("td_p", "td_a"),
            ("td_p", "td_b"),
        ]
        assert "children" not in {
            column.name
            for column in connection.introspection.get_table_description(
                connection.cursor(), "todos"
            )
        }
        call_command("migrate", *previous, verbosity=0)
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, children FROM todos WHERE children IS NOT NULL ORDER BY id")
            assert cursor.fetchall() == [("td_b", ["td_c"]), ("td_p", ["td_a", "td_b"])]
    finally:
        call_command("migrate", "switchboard_todos", verbosity=0)
