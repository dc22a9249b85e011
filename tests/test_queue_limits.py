"""A queue's pause, rate and concurrency limits (its todo_queues row), enforced by the claim
statements themselves: claim_next and claim_batch, claim by id, and queryset claims."""

from __future__ import annotations

import json
import subprocess
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper
from django.test.utils import CaptureQueriesContext

from switchboard_todos.exceptions import TodoConflict
from switchboard_todos.models import Queue, State, Todo
from switchboard_todos.sql import queries
from tests.conftest import database_url, run_in_threads
from tests.helpers import MakeTodo, OutputLines, db_now, round_trips, wait_until
from tests.test_sql import claim_params, nodes

Spawn = Callable[..., "subprocess.Popen[str]"]


def test_a_paused_queue_is_passed_over(make_todo: MakeTodo) -> None:
    """Nothing of a paused queue is claimed, by any claim; its neighbours are."""
    Queue.objects.create(name="a", paused=True)
    paused, open_ = make_todo(queue="a"), make_todo(queue="b")
    make_todo(queue="a", state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5))
    claimed = Todo.objects.claim_batch(["a", "b"], "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [open_.id]
    assert Todo.objects.filter(queue="a").claim_batch("w1", 30, 10) == []
    with pytest.raises(TodoConflict, match="queue 'a' is paused"):
        Todo.objects.claim(paused.id, "w1", 30)


def test_a_pause_ends_at_its_resume_at(make_todo: MakeTodo) -> None:
    """A pause with a resume_at that has come stops nothing; one still to come does."""
    now = db_now()
    Queue.objects.create(name="past", paused=True, resume_at=now - timedelta(seconds=1))
    Queue.objects.create(name="future", paused=True, resume_at=now + timedelta(hours=1))
    resumed = make_todo(queue="past")
    make_todo(queue="future")
    claimed = Todo.objects.claim_batch(["past", "future"], "w1", 30, limit=10)
    assert [todo.id for todo in claimed] == [resumed.id]


def test_a_rate_limit_lets_through_what_its_window_has_left(make_todo: MakeTodo) -> None:
    """3 claims an hour: a batch takes 3, the next claims nothing until the next window."""
    Queue.objects.create(name="slow", rate_limit=3, rate_period=timedelta(hours=1))
    todos = [make_todo(queue="slow") for _ in range(5)]
    assert len(Todo.objects.claim_batch("slow", "w1", 30, limit=10)) == 3
    assert Todo.objects.claim_next("slow", "w1", 30) is None
    with pytest.raises(TodoConflict, match="at its rate or concurrency limit"):
        Todo.objects.claim(todos[4].id, "w1", 30)
    row = Queue.objects.get(name="slow")
    assert row.rate_count == 3
    assert row.rate_window is not None and row.rate_window <= db_now()
    # The window passes: the count starts again from zero.
    Queue.objects.filter(name="slow").update(rate_window=row.rate_window - timedelta(hours=1))
    assert len(Todo.objects.claim_batch("slow", "w1", 30, limit=10)) == 2
    assert Queue.objects.get(name="slow").rate_count == 2


def test_a_concurrency_limit_holds_slots_until_todos_leave_claimed(make_todo: MakeTodo) -> None:
    """A limit of 2: two slots, freed by complete, fail or release, taken by the next claims."""
    Queue.objects.create(name="narrow", concurrency_limit=2)
    for _ in range(5):
        make_todo(queue="narrow")
    first = Todo.objects.claim_batch("narrow", "w1", 30, limit=10)
    assert {todo.slot for todo in first} == {1, 2}
    assert Todo.objects.claim_next("narrow", "w2", 30) is None
    done = next(todo for todo in first if todo.slot == 1)
    Todo.objects.complete(done.id, "w1")
    second = Todo.objects.claim_batch("narrow", "w2", 30, limit=10)
    assert [todo.slot for todo in second] == [1]
    Todo.objects.release(second[0].id, "w2")
    assert [todo.slot for todo in Todo.objects.claim_batch("narrow", "w3", 30, limit=10)] == [1]


def test_a_limited_claim_reads_its_slots_once(make_todo: MakeTodo) -> None:
    """Reproduction: each todo claimed from a queue with a concurrency limit looked up its slot
    by reading the whole "slot" CTE, a batch's cost growing with its square (a worker's batches
    of 400 drained such a queue at 0.68 of the raw loop; 0.99 with no limit)."""
    Queue.objects.create(name="wide", concurrency_limit=100)
    for _ in range(50):
        make_todo(queue="wide")
    params = claim_params(["wide"], 50)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries["claim_next"], params)
        (plan,) = cursor.fetchone()
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    reads = [node["Actual Loops"] for node in nodes(plan) if node.get("CTE Name") == "slot"]
    assert reads and max(reads) == 1, reads
    slots = Todo.objects.filter(queue="wide", state=State.CLAIMED).values_list("slot", flat=True)
    assert set(slots) == set(range(1, 51))


def test_a_limited_claim_probes_free_slots_not_every_held_one(vacuumed: None, db: None) -> None:
    """Reproduction: the claim's search for free slots of a queue with a concurrency limit
    was planned as an anti-join that read every claimed todo of the queue once per slot it
    tried (a Materialize of them all), on statistics gathered while none was claimed, as after
    a vacuum of an idle queue: 3,600 held and a claim of 400 read 1.4 million rows, 122 ms in
    the section that the queue's claims take one at a time (bench/queue_limits.py: 0.41 and
    0.23 of the raw loop at 4 and 8 processes). Each slot is one probe of idx_todos_slot. Nor
    does a claim that is not looking for expired leases read the held todos for those it takes
    over: it read all 1,600 through idx_todos_held (taken_over, 1.4 ms at 3,600)."""
    Queue.objects.create(name="wide", concurrency_limit=10_000)
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (queue, kind) SELECT 'wide', 'k' FROM generate_series(1, 4000)"
        )
        cursor.execute("ANALYZE todos")
    for batch in range(4):
        assert len(Todo.objects.claim_batch("wide", f"w{batch}", 30, 400)) == 400
    params = claim_params(["wide"], 400, owner="w9")
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + queries["claim_next"], params)
        (plan,) = cursor.fetchone()
    plan = (json.loads(plan) if isinstance(plan, str) else plan)[0]["Plan"]
    (free_slot,) = [node for node in nodes(plan) if node.get("Subplan Name") == "CTE free_slot"]
    read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        for node in nodes(free_slot)
        if node["Node Type"] == "Materialize" or node.get("Index Name") == "idx_todos_slot"
    )
    assert read <= 400, read
    assert free_slot["Actual Rows"] == 400
    (taken_over,) = [node for node in nodes(plan) if node.get("Subplan Name") == "CTE taken_over"]
    scans = [node for node in nodes(taken_over) if node.get("Relation Name") == "todos"]
    assert scans and not [scan for scan in scans if scan["Actual Loops"]], scans


def test_a_claim_of_queues_without_limits_stays_one_statement(
    make_todo: MakeTodo, django_assert_num_queries: Any
) -> None:
    """Rows that limit nothing (a description, a visibility timeout) change nothing, and a
    limited queue beside them costs no extra round trip either."""
    Queue.objects.create(name="plain", description="a row that limits nothing")
    Queue.objects.create(
        name="limited", concurrency_limit=1, rate_limit=5, rate_period=timedelta(minutes=1)
    )
    for queue in ("plain", "plain", "limited", "limited", "other"):
        make_todo(queue=queue)
    with django_assert_num_queries(1):
        claimed = Todo.objects.claim_batch(["plain", "limited", "other"], "w1", 30, limit=10)
    assert Counter(todo.queue for todo in claimed) == {"plain": 2, "limited": 1, "other": 1}
    assert {todo.slot for todo in claimed if todo.queue != "limited"} == {None}


@pytest.mark.django_db(transaction=True)
def test_two_claims_racing_for_the_last_slot_take_it_once() -> None:
    """Both see the one slot free; the unique index lets one through, the other runs again and
    finds the queue full."""
    Queue.objects.create(name="one", concurrency_limit=1)
    for _ in range(4):
        Todo.objects.create_todo(queue="one", kind="k")
    claimed = run_in_threads(8, lambda n: Todo.objects.claim_batch("one", f"w{n}", 30, 2))
    assert sum(len(batch) for batch in claimed) == 1
    assert Todo.objects.filter(queue="one", state=State.CLAIMED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_the_queue_row_takes_other_slots() -> None:
    """Reproduction: a claim of a limited queue that waited for the claim before it (the queue's
    row locked) read the claimed todos in the snapshot it began with, picked the slots that
    claim had just taken, hit idx_todos_slot, and ran again: at 8 worker processes most claims
    were wasted (0.22 of the raw loop). It starts past them now, in one round trip: its turn at
    the queue's row (claim_turn), then the claim."""
    Queue.objects.create(name="wide", concurrency_limit=100)
    Todo.objects.create_many([{"queue": "wide", "kind": "k"} for _ in range(20)])
    first: list[Todo] = []
    with (
        claimed_ahead(first, 5),
        CaptureQueriesContext(connection) as statements,
        round_trips(connection) as made,
    ):
        second = Todo.objects.claim_batch("wide", "second", 30, 5)
    assert [query["sql"][:26] for query in statements] == [
        "-- Wait for a claim's turn",  # claim_turn
        "-- Claim up to 5 of the cl",  # claim_next_few
    ]
    assert made == [1]
    assert {todo.slot for todo in first} == {1, 2, 3, 4, 5}
    assert {todo.slot for todo in second} == {6, 7, 8, 9, 10}
    assert Queue.objects.get(name="wide").slot_cursor == 10


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_waited_for_its_turn_reads_past_what_the_claims_ahead_took() -> None:
    """Reproduction: a claim that waited for the queue's row inside its own statement scanned
    in the snapshot it began with, where the 200 todos the claim ahead of it took still looked
    pending: it read each (and tried to lock it again). Waiting for its turn ahead of the claim
    (claim_turn), it reads only the todos still pending. Read in its own transaction's count of
    the rows it fetched through idx_todos_pending."""
    Queue.objects.create(name="wide", concurrency_limit=1000)
    Todo.objects.create_many([{"queue": "wide", "kind": "k"} for _ in range(400)])
    Todo.objects.claim_batch("wide", "warm", 30, 1)  # the process learns the queue is limited
    with claimed_ahead([], 200), transaction.atomic():
        second = Todo.objects.claim_batch("wide", "second", 30, 5)
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_stat_get_xact_tuples_fetched('idx_todos_pending'::regclass)")
            [fetched] = cursor.fetchone()
    assert len(second) == 5
    assert fetched < 100, fetched  # 206 before (5 taken, 200 passed over, 1 the warm claim's)


@contextmanager
def claimed_ahead(first: list[Todo], limit: int) -> Iterator[None]:
    """Inside, a claim of `limit` todos of queue "wide" (into `first`), made before, holds the
    queue's row in a transaction of another thread's connection, until a claim waits for it;
    the thread is joined on the way out."""
    holding = threading.Event()

    def hold_a_claim() -> None:
        try:
            with transaction.atomic():
                first.extend(Todo.objects.claim_batch("wide", "first", 30, limit))
                holding.set()
                wait_until(
                    lambda: waiting_on_a_lock(connection),
                    "the second claim to wait for the queue's row",
                )
        finally:
            connections.close_all()

    thread = threading.Thread(target=hold_a_claim)
    thread.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        thread.join()


def waiting_on_a_lock(on: BaseDatabaseWrapper) -> bool:
    """Whether another session waits for a lock."""
    with on.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()"
        )
        return bool(cursor.fetchone()[0])


class ClaimedCount(threading.Thread):
    """The most todos of `queue` claimed at once, read every few milliseconds, each count in
    one snapshot, on a connection of its own, until stopped."""

    def __init__(self, queue: str) -> None:
        super().__init__(daemon=True)
        self.queue = queue
        self.most = 0
        self.reads = 0
        self.stop = threading.Event()

    def run(self) -> None:
        with psycopg.connect(database_url(), autocommit=True) as watcher:
            while not self.stop.is_set():
                (count,) = watcher.execute(
                    "SELECT count(*) FROM todos WHERE queue = %s AND state = 'claimed'",
                    [self.queue],
                ).fetchone() or (0,)
                self.most = max(self.most, count)
                self.reads += 1


def client_backends() -> int:
    """The client connections to this database, this test's included."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND backend_type = 'client backend'"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_eight_processes_never_hold_more_than_the_concurrency_limit(spawn: Spawn) -> None:
    """8 claiming processes, a queue limited to 3 claimed: never 4 at once, and all done.

    Watched from outside (a consistent count, many times a second), and by the slots the todos
    held: each of 1 to 3, which idx_todos_slot gives one claimed todo at a time. (The claim and
    completion times cannot show it: a claim's now() is when its statement began, before it
    found the slot that a completion committing meanwhile freed.)
    """
    Queue.objects.create(name="narrow", concurrency_limit=3, paused=True)
    Todo.objects.enqueue_many([{"queue": "narrow", "kind": "k"} for _ in range(60)])
    watch = ClaimedCount("narrow")
    watch.start()
    before = client_backends()
    claimers = [
        spawn("tests.claimer", "narrow", f"c{n}", "--hold", "0.02", "--limit", "2")
        for n in range(8)
    ]
    # All 8 claiming (and finding the queue paused) before any claims: on a loaded machine,
    # the first started could drain the 60 todos before the last had started.
    wait_until(lambda: client_backends() >= before + 8, "the 8 claimers to connect")
    Queue.objects.filter(name="narrow").update(paused=False)
    for claimer in claimers:
        _, errors = claimer.communicate(timeout=120)
        assert claimer.returncode == 0, errors
    watch.stop.set()
    watch.join(10)
    assert Todo.objects.filter(queue="narrow", state=State.DONE).count() == 60
    assert set(Todo.objects.filter(queue="narrow").values_list("slot", flat=True)) == {1, 2, 3}
    assert watch.reads > 100 and watch.most == 3, (watch.reads, watch.most)


@pytest.mark.django_db(transaction=True)
def test_a_rate_limit_holds_across_processes(spawn: Spawn) -> None:
    """10 claims per 2 s, 4 claiming processes: every window lets through 10, none more; the
    first lets through what is left of it once the processes are up (they start at any moment
    of a window, by the database's clock), the last what is left of the backlog."""
    Queue.objects.create(name="paced", rate_limit=10, rate_period=timedelta(seconds=2))
    Todo.objects.enqueue_many([{"queue": "paced", "kind": "k"} for _ in range(35)])
    claimers = [spawn("tests.claimer", "paced", f"c{n}", "--limit", "3") for n in range(4)]
    for claimer in claimers:
        _, errors = claimer.communicate(timeout=120)
        assert claimer.returncode == 0, errors
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT floor(extract(epoch FROM claimed_at) / 2), count(*) FROM todos"
            " WHERE queue = 'paced' GROUP BY 1 ORDER BY 1"
        )
        per_window = [count for _, count in cursor.fetchall()]
    assert sum(per_window) == 35
    assert max(per_window) == 10
    # Between the first window and the last, every one the backlog filled.
    assert len(per_window) >= 4 and set(per_window[1:-1]) == {10}, per_window


@pytest.mark.django_db(transaction=True)
def test_a_pause_stops_a_worker_within_one_claim_and_resume_at_restarts_it(
    spawn: Spawn,
) -> None:
    """The worker finishes what it holds and claims nothing more of the paused queue until
    its resume_at comes, then drains it by itself."""
    Todo.objects.enqueue_many(
        [{"queue": "steady", "kind": "test.sleep", "payload": {"seconds": 0.05}}] * 40
    )
    worker = OutputLines(
        spawn(
            "manage",
            "todo_worker",
            "--import-module",
            "tests.worker_handlers",
            "--queue",
            "steady",
            "--concurrency",
            "2",
            "--batch",
            "1",
        ).stderr
    )
    done = Todo.objects.filter(queue="steady", state=State.DONE)
    wait_until(lambda: done.count() >= 5, "the worker to get going")
    Queue.objects.create(name="steady", paused=True, resume_at=db_now() + timedelta(seconds=3))
    paused_at = db_now()  # the pause has committed
    wait_until(
        lambda: not Todo.objects.filter(queue="steady", state=State.CLAIMED).exists(),
        "the todos in hand to finish",
    )
    resume_at = Queue.objects.get(name="steady").resume_at
    assert resume_at is not None and db_now() < resume_at, "the test machine is too slow"
    assert not Todo.objects.filter(queue="steady", claimed_at__gt=paused_at).exists()
    assert Todo.objects.filter(queue="steady", state=State.PENDING).exists()
    wait_until(lambda: done.count() == 40, "the worker to resume by itself", timeout=60)
    first_after = Todo.objects.filter(queue="steady", claimed_at__gt=paused_at).earliest(
        "claimed_at"
    )
    assert first_after.claimed_at is not None, worker.output
    assert first_after.claimed_at >= resume_at, worker.output


def test_a_claim_that_began_in_a_window_since_closed_takes_nothing(make_todo: MakeTodo) -> None:
    """A claim whose now() falls in a window before the row's (it waited for the row while a
    later claim opened the next window) must not count from zero in its own: it takes nothing,
    and leaves the row's window as it was."""
    Queue.objects.create(
        name="paced",
        rate_limit=3,
        rate_period=timedelta(hours=1),
        rate_window=db_now() + timedelta(hours=2),  # a later window has begun
        rate_count=1,
    )
    make_todo(queue="paced")
    assert Todo.objects.claim_batch("paced", "w1", 30, limit=10) == []
    row = Queue.objects.get(name="paced")
    assert row.rate_count == 1 and row.rate_window is not None and row.rate_window > db_now()
