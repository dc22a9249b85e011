"""The reaper: `reap_todos` once and in a loop, signals, a lost database, reapers racing.

The command tests commit (transaction=True): each sweep closes its connection, as a
long-running process must, which would end a test's enclosing transaction.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import DatabaseError, connection, transaction

from switchboard_todos.models import State, Todo
from switchboard_todos.shutdown import Shutdown
from switchboard_todos.upkeep import vacuum
from switchboard_todos.upkeep.reaper import Reaper
from tests.conftest import alter_test_database, run_in_threads
from tests.helpers import MakeTodo, read_until

LAPSED = timedelta(seconds=-5)
committed = pytest.mark.django_db(transaction=True)


def lapsed_todos(make_todo: MakeTodo) -> dict[str, Todo]:
    """One todo of each kind a sweep meets: two to requeue, one to dead-letter, two to leave."""
    return {
        "requeue_1": make_todo(state=State.CLAIMED, attempt=1, lease_expires_in=LAPSED),
        "requeue_2": make_todo(state=State.CLAIMED, attempt=4, lease_expires_in=LAPSED),
        "dead_letter": make_todo(state=State.CLAIMED, attempt=5, lease_expires_in=LAPSED),
        "live_lease": make_todo(state=State.CLAIMED, attempt=1),
        "pending": make_todo(),
    }


def insert_lapsed(count: int, *, attempt: int) -> None:
    """Insert `count` claimed todos whose lease lapsed a minute ago, in one statement."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO todos (kind, state, owner, attempt, max_attempts, claimed_at, "
            "lease_expires_at) SELECT 'test.kind', 'claimed', 'w' || n, %s, 5, "
            "now() - interval '2 minutes', now() - interval '1 minute' "
            "FROM generate_series(1, %s) AS n",
            [attempt, count],
        )


# One sweep


@committed
def test_reap_todos_sweeps_once_and_prints_the_counts(
    make_todo: MakeTodo, caplog: pytest.LogCaptureFixture
) -> None:
    """By default one sweep requeues or dead-letters the lapsed leases, prints and logs counts."""
    todos = lapsed_todos(make_todo)
    out = StringIO()
    with caplog.at_level(logging.INFO, logger="switchboard_todos.reaper"):
        call_command("reap_todos", stdout=out)
    assert out.getvalue() == "Reaped lapsed leases: 2 requeued, 1 dead-lettered.\n"
    # Beside, perhaps, an ANALYZE of a table that other tests left full of dead rows.
    reaped = [message for message in caplog.messages if message.startswith("Reaped")]
    assert reaped == ["Reaped lapsed leases: 2 requeued, 1 dead-lettered."]
    states = {name: Todo.objects.get(pk=todo.pk).state for name, todo in todos.items()}
    assert states == {
        "requeue_1": State.PENDING,
        "requeue_2": State.PENDING,
        "dead_letter": State.FAILED,
        "live_lease": State.CLAIMED,
        "pending": State.PENDING,
    }


@committed
def test_reap_todos_prints_a_sweep_that_found_nothing() -> None:
    """A single sweep always says what it did, even when that is nothing."""
    out = StringIO()
    call_command("reap_todos", stdout=out)
    assert out.getvalue() == "Reaped lapsed leases: 0 requeued, 0 dead-lettered.\n"


@committed
def test_reap_todos_quiet_at_verbosity_0(make_todo: MakeTodo) -> None:
    """-v 0 prints nothing but still reaps."""
    todo = make_todo(state=State.CLAIMED, lease_expires_in=LAPSED)
    out = StringIO()
    call_command("reap_todos", verbosity=0, stdout=out)
    assert out.getvalue() == ""
    assert Todo.objects.get(pk=todo.pk).state == State.PENDING


# The planner's picture of todos


def emptied() -> None:
    """Empty todos and measure it empty, as a TRUNCATE or a purge and then VACUUM leave it."""
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE todos CASCADE")
        cursor.execute("VACUUM todos")


def seq_scans_of_a_claim() -> int:
    """How many sequential scans of todos a claim of 10 on this connection ran: the backend's
    count not yet reported, before and after, in one transaction (it reports at the end)."""
    count = "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = 'todos'"
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(count)
        (before,) = cursor.fetchone()
        Todo.objects.claim_batch("default", "w1", 30, 10)
        cursor.execute(count)
        (after,) = cursor.fetchone()
    return int(after - before)


@committed
def test_a_claim_planned_on_an_empty_table_scans_it_until_it_is_analyzed() -> None:
    """The fault for real: a connection that first claimed while todos was empty keeps a
    generic plan that reads the whole table at every claim once work arrives (17.7 ms a todo
    at 100,000). Once the table has outgrown what the planner measured eightfold,
    analyze_if_outgrown analyzes it, the connection plans again, and claims use the indexes;
    then there is nothing more to do. (Two claims: the process's first is a full scan, the
    second lean, and each statement keeps the plan it was first given.)"""
    emptied()
    for _ in range(2):
        assert Todo.objects.claim_batch("default", "w1", 30, 10) == []
    Todo.objects.enqueue_many({"kind": "k", "payload": {"n": n}} for n in range(6000))
    assert seq_scans_of_a_claim() > 0
    outgrown = vacuum.analyze_if_outgrown("default")
    assert outgrown is not None
    assert outgrown.measured == 0 and outgrown.now >= vacuum.OUTGROWN_PAGES
    assert seq_scans_of_a_claim() == 0
    assert vacuum.analyze_if_outgrown("default") is None


@committed
def test_a_sweep_analyzes_todos_once_it_outgrew_what_the_planner_measured(
    caplog: pytest.LogCaptureFixture,
) -> None:
    emptied()
    Todo.objects.enqueue_many({"kind": "k"} for _ in range(6000))
    with caplog.at_level(logging.INFO, logger="switchboard_todos.reaper"), Shutdown() as stop:
        Reaper(interval=3600, shutdown=stop).sweep()
        Reaper(interval=3600, shutdown=stop).sweep()
    [line] = [message for message in caplog.messages if "analyzed todos" in message]
    assert line.startswith("Database 'default': analyzed todos, ")
    assert line.endswith(
        " pages where the planner last measured 0; the prepared statements are planned again."
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT relpages FROM pg_class WHERE oid = 'todos'::regclass")
        assert cursor.fetchone()[0] >= vacuum.OUTGROWN_PAGES


# The loop


@committed
def test_reap_todos_loop_sweeps_until_max_sweeps(make_todo: MakeTodo) -> None:
    """--loop sweeps every --interval; at -v 2 every sweep is printed, then the totals."""
    make_todo(state=State.CLAIMED, lease_expires_in=LAPSED)
    out = StringIO()
    call_command(
        "reap_todos", "--loop", "--interval", "0.01", "--max-sweeps", "3", verbosity=2, stdout=out
    )
    assert out.getvalue().splitlines() == [
        "Reaping lapsed leases every 0.01 s until SIGTERM or SIGINT.",
        "Reaped lapsed leases: 1 requeued, 0 dead-lettered.",
        "Reaped lapsed leases: 0 requeued, 0 dead-lettered.",
        "Reaped lapsed leases: 0 requeued, 0 dead-lettered.",
        "Stopped at --max-sweeps after 3 sweeps (0 failed): 1 requeued, 0 dead-lettered in total.",
    ]


@committed
def test_reap_todos_loop_prints_only_sweeps_that_reaped(make_todo: MakeTodo) -> None:
    """At the default verbosity an idle loop stays quiet between its first and last line."""
    out = StringIO()
    call_command("reap_todos", "--loop", "--interval", "0.01", "--max-sweeps", "2", stdout=out)
    assert len(out.getvalue().splitlines()) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval", "5"], "--interval only applies with --loop"),
        (["--max-sweeps", "2"], "--max-sweeps only applies with --loop"),
        (["--loop", "--interval", "0"], "argument --interval: duration '0' must be more than zero"),
        (["--loop", "--interval", "soon"], "argument --interval: invalid duration 'soon'"),
        (["--loop", "--max-sweeps", "0"], "argument --max-sweeps: '0' must be 1 or more"),
    ],
)
def test_reap_todos_rejects_bad_arguments(args: list[str], message: str) -> None:
    """Arguments are checked before anything runs, with a message naming the argument."""
    with pytest.raises(CommandError, match=message):
        call_command("reap_todos", *args)


# The database


def set_allow_connections(allowed: bool) -> None:
    """Let connections into the test database, or refuse them."""
    alter_test_database(f"ALLOW_CONNECTIONS {'true' if allowed else 'false'}")


@pytest.fixture
def database_outage() -> Iterator[Callable[[bool], None]]:
    """Switch new connections to the test database off and on; always on again after."""
    try:
        yield set_allow_connections
    finally:
        set_allow_connections(True)


class _OnFirstWarning(logging.Handler):
    """Run `action` when the first warning is logged: the moment the loop notices an outage."""

    def __init__(self, action: Callable[[], None]) -> None:
        super().__init__(logging.WARNING)
        self.action = action
        self.done = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.done:
            self.done = True
            self.action()


@committed
@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("outage", "is not currently accepting connections"),
        ("read_only", "in a read-only transaction"),
    ],
)
def test_a_looping_reaper_outlives_a_fault_of_the_database(
    fault: str,
    message: str,
    make_todo: MakeTodo,
    database_outage: Callable[[bool], None],
    read_only_database: Callable[[bool], None],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A database lost, or turned read-only by a failover, after the first sweep is logged
    and retried; the loop carries on."""
    switch = database_outage if fault == "outage" else read_only_database
    faulty = fault != "outage"  # the argument that turns the fault on: allow=False, read-only=True

    def begin() -> None:
        switch(faulty)

    def end() -> None:
        switch(not faulty)

    todo = make_todo(state=State.CLAIMED, lease_expires_in=LAPSED)
    logger = logging.getLogger("switchboard_todos.reaper")
    recover = _OnFirstWarning(end)
    lines: list[str] = []

    def report(line: str) -> None:
        lines.append(line)
        if len(lines) == 1:  # after the first sweep, while the loop waits for the next
            begin()

    logger.addHandler(recover)
    try:
        with caplog.at_level(logging.INFO, logger="switchboard_todos.reaper"), Shutdown() as stop:
            totals = Reaper(
                interval=0.01, shutdown=stop, max_sweeps=3, report=report, report_idle=True
            ).run()
    finally:
        logger.removeHandler(recover)
    assert (totals.sweeps, totals.failed_sweeps, totals.requeued) == (3, 1, 1)
    assert len(lines) == 2
    warning = next(r for r in caplog.records if r.levelno == logging.WARNING)
    assert message in warning.getMessage()
    assert "sweep 2 failed, 1 in a row; retrying in" in warning.getMessage()
    assert "Database available again after 1 failed sweeps." in caplog.messages
    assert Todo.objects.get(pk=todo.pk).state == State.PENDING


@committed
def test_reap_todos_exits_when_the_first_sweep_fails(
    database_outage: Callable[[bool], None],
) -> None:
    """A database that refuses the first sweep ends the run with a one-line CommandError."""
    database_outage(False)
    connection.close()
    with pytest.raises(CommandError) as raised:
        call_command("reap_todos", "--loop", "--max-sweeps", "5")
    message = str(raised.value)
    assert message.startswith("Cannot reach the database: ")
    assert "is not currently accepting connections" in message
    assert "\n" not in message


@pytest.fixture
def todos_table_renamed() -> Iterator[Callable[[], None]]:
    """Rename `todos` away on demand (a schema error, not an outage); renamed back after."""
    renamed = False

    def rename() -> None:
        nonlocal renamed
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE todos RENAME TO todos_away")
        renamed = True

    yield rename
    if renamed:
        with connection.cursor() as cursor:
            cursor.execute("ALTER TABLE todos_away RENAME TO todos")


@committed
def test_a_schema_error_at_the_first_sweep_is_one_line(
    todos_table_renamed: Callable[[], None],
) -> None:
    """Other database errors at the start are reported in one line too."""
    todos_table_renamed()
    with pytest.raises(CommandError, match=r'^Reaping failed: relation "todos" does not exist'):
        call_command("reap_todos")


@committed
def test_a_schema_error_later_is_not_retried(todos_table_renamed: Callable[[], None]) -> None:
    """Only an unavailable database is retried: a broken schema ends the loop with the error."""
    with Shutdown() as stop:
        reaper = Reaper(
            interval=0.01,
            shutdown=stop,
            max_sweeps=3,
            report=lambda line: todos_table_renamed(),
            report_idle=True,
        )
        with pytest.raises(DatabaseError, match='relation "todos" does not exist'):
            reaper.run()


# Stopping


def test_shutdown_wakes_a_sleeper_and_restores_the_handlers() -> None:
    """A signal inside `with Shutdown()` is a stop request; leaving it restores the handlers."""
    before = signal.getsignal(signal.SIGTERM)
    with Shutdown() as stop:
        assert stop.wait(0) is False
        signal.raise_signal(signal.SIGTERM)
        started = time.monotonic()
        assert stop.wait(3600) is True
        assert time.monotonic() - started < 60
        assert stop.signal == signal.SIGTERM
        # The second signal would now end the process the default way.
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_requested_stop_ends_the_loop_before_any_sweep() -> None:
    """A loop asked to stop before it starts sweeps nothing (and touches no database)."""
    with Shutdown() as stop:
        stop.request()
        totals = Reaper(interval=3600, shutdown=stop).run()
    assert totals.sweeps == 0


@committed
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_sleeping_reaper_at_once(
    spawn: Callable[..., subprocess.Popen[str]], make_todo: MakeTodo, signum: signal.Signals
) -> None:
    """SIGTERM or SIGINT wakes a reaper sleeping for an hour; it exits 0 with its totals."""
    make_todo(state=State.CLAIMED, lease_expires_in=LAPSED)
    process = spawn("manage", "reap_todos", "--loop", "--interval", "1h")
    assert process.stdout is not None
    read_until(process.stdout, "Reaped lapsed leases: 1 requeued")
    process.send_signal(signum)
    # Well under the hour it would otherwise sleep (the machine is shared and slow at times).
    assert process.wait(timeout=30) == 0
    out, err = process.communicate()
    assert out == (
        f"Stopped on {signum.name} after 1 sweep (0 failed): "
        "1 requeued, 0 dead-lettered in total.\n"
    )
    assert err == ""


def test_an_unreachable_database_exits_1_with_one_line(
    spawn: Callable[..., subprocess.Popen[str]], subprocess_env: dict[str, str]
) -> None:
    """No database at start: status 1 and a single line on stderr, no traceback."""
    subprocess_env["DATABASE_URL"] = "postgres://postgres@127.0.0.1:1/nowhere"
    process = spawn("manage", "reap_todos", "--loop")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 1
    assert out == "Reaping lapsed leases every 10 s until SIGTERM or SIGINT.\n"
    assert err.startswith("CommandError: Cannot reach the database: connection failed:")
    assert err.count("\n") == 1


# Reapers racing


@committed
def test_concurrent_reapers_reap_each_lapsed_lease_once() -> None:
    """Four reapers racing over the same lapsed leases requeue or dead-letter each exactly once."""
    insert_lapsed(600, attempt=2)
    insert_lapsed(300, attempt=5)
    results = run_in_threads(4, lambda _: Todo.objects.reap_expired())
    assert sum(r.requeued for r in results) == 600
    assert sum(r.dead_lettered for r in results) == 300
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT state, (SELECT count(*) FROM todo_errors WHERE todo_id = todos.id), count(*)"
            " FROM todos GROUP BY 1, 2 ORDER BY 1"
        )
        assert cursor.fetchall() == [("failed", 1, 300), ("pending", 1, 600)]


@committed
def test_a_reaper_skips_leases_another_session_holds() -> None:
    """Rows locked by another transaction are skipped at once, and reaped by a later sweep."""
    insert_lapsed(10, attempt=1)
    held = list(Todo.objects.order_by("id").values_list("id", flat=True)[:4])
    other = connection.copy()
    try:
        other.set_autocommit(False)
        with other.cursor() as cursor:
            cursor.execute("SELECT id FROM todos WHERE id = ANY(%s) FOR UPDATE", [held])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '2s'")  # a sweep that waited would fail
        first = Todo.objects.reap_expired()
        assert (first.requeued, first.dead_lettered) == (6, 0)
        assert set(Todo.objects.filter(state=State.CLAIMED).values_list("id", flat=True)) == set(
            held
        )
        other.rollback()
        second = Todo.objects.reap_expired()
        assert (second.requeued, second.dead_lettered) == (4, 0)
    finally:
        other.close()


def test_shutdown_off_the_main_thread_stops_only_on_request() -> None:
    """Off the main thread no handler is installed (Python forbids it); request() still works."""
    before = signal.getsignal(signal.SIGTERM)
    seen: list[bool] = []

    def run() -> None:
        with Shutdown() as stop:
            seen.append(signal.getsignal(signal.SIGTERM) == before)
            stop.request()
            seen.append(stop.wait(3600))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=60)
    assert seen == [True, True]


def test_reap_works_in_bounded_batches(
    make_todo: MakeTodo, settings: Any, django_assert_num_queries: Any
) -> None:
    """The reaper takes lapsed leases back REAP_BATCH at a time: 5 lapsed, batches of 2, three
    statements, and every one of them requeued."""
    settings.SWITCHBOARD_TODOS_REAP_BATCH = 2
    lapsed = [
        make_todo(state=State.CLAIMED, lease_expires_in=timedelta(seconds=-5)) for _ in range(5)
    ]
    with django_assert_num_queries(3):
        assert Todo.objects.reap_expired() == (5, 0)
    assert {todo.state for todo in Todo.objects.filter(pk__in=[t.id for t in lapsed])} == {
        State.PENDING
    }
