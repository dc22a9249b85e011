"""`manage.py todo_stats` and `manage.py requeue_todos`, and the health numbers behind them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Iterator
from datetime import timedelta
from io import StringIO
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.db import connection

from switchboard_todos import stats
from switchboard_todos.models import State, Todo
from tests.helpers import MakeTodo

Spawn = Callable[..., subprocess.Popen[str]]


def run(command: str, *args: str) -> tuple[str, str]:
    out, err = StringIO(), StringIO()
    call_command(command, *args, stdout=out, stderr=err)
    return out.getvalue(), err.getvalue()


@pytest.fixture
def busy_queues(make_todo: MakeTodo) -> dict[str, Todo]:
    """Two queues with todos in every situation the health numbers count."""
    todos = {
        "ready": make_todo(queue="mail", created_ago=timedelta(minutes=10)),
        "due": make_todo(queue="mail", next_retry_in=timedelta(minutes=-30)),
        "waiting": make_todo(queue="mail", next_retry_in=timedelta(minutes=5)),
        "claimed": make_todo(queue="mail", state=State.CLAIMED),
        "expired": make_todo(
            queue="mail", state=State.CLAIMED, lease_expires_in=timedelta(seconds=-1)
        ),
        "done": make_todo(queue="billing", state=State.DONE),
        "dead": make_todo(queue="billing", state=State.FAILED),
        "dead2": make_todo(queue="billing", state=State.FAILED),
    }
    todos["blocked"] = Todo.objects.create_todo(
        queue="mail", kind="merge", after=[todos["claimed"].id]
    )[0]
    return todos


# the numbers


def test_queue_health_counts_each_situation(busy_queues: dict[str, Todo]) -> None:
    """Ready includes due retries; blocked todos are not scheduled ones; the oldest ready age
    is the longest claimable wait."""
    Todo.objects.filter(pk=busy_queues["done"].pk).update(
        completed_at=busy_queues["done"].completed_at - timedelta(hours=25)  # type: ignore[operator]
    )
    health = {row.queue: row for row in stats.queue_health()}
    assert health["mail"] == stats.QueueHealth(
        queue="mail",
        ready=2,
        scheduled=1,
        claimed=1,
        lease_expired=1,
        done_recently=0,
        dead=0,
        oldest_ready_age=timedelta(minutes=30),
        dead_lettered_recently=0,
        blocked=1,
    )
    billing = health["billing"]
    assert (billing.done_recently, billing.dead, billing.dead_lettered_recently) == (0, 2, 2)
    assert health["billing"].oldest_ready_age is None


def test_queue_health_counts_todos_done_in_the_last_day(busy_queues: dict[str, Todo]) -> None:
    """A todo completed just now counts as done in the last 24 hours."""
    assert stats.queue_health(["billing"])[0].done_recently == 1


def test_queue_health_of_chosen_queues(busy_queues: dict[str, Todo]) -> None:
    """Asking for queues gives only those; an unknown queue gives nothing."""
    assert [row.queue for row in stats.queue_health(["billing", "nowhere"])] == ["billing"]


def test_distinct_values_skip_through_the_index(make_todo: MakeTodo) -> None:
    """Each distinct value once, in order, nulls left out, at most `limit`."""
    for queue, assignee in [("b", None), ("a", "x"), ("b", "y"), ("c", "x")]:
        make_todo(queue=queue, assignee=assignee)
    assert stats.distinct_values("queue") == ["a", "b", "c"]
    assert stats.distinct_values("queue", limit=2) == ["a", "b"]
    assert stats.distinct_values("assignee") == ["x", "y"]


def test_recent_kinds(make_todo: MakeTodo) -> None:
    """Kinds of the newest todos only; empty kinds are left out."""
    make_todo(kind="", title="untyped", created_ago=timedelta(days=2))
    make_todo(kind="old.kind", created_ago=timedelta(days=1))
    make_todo(kind="new.kind")
    assert stats.recent_kinds() == ["new.kind", "old.kind"]
    assert stats.recent_kinds(recent=1) == ["new.kind"]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0 s"), (59.6, "1 min 0 s"), (125, "2 min 5 s"), (7260, "2 h 1 min"), (90061, "1 d 1 h")],
)
def test_format_age(seconds: float, text: str) -> None:
    """Two largest units, rounded to the second."""
    assert stats.format_age(timedelta(seconds=seconds)) == text


@pytest.fixture
def tenants(make_todo: MakeTodo) -> None:
    """Queue imports: three fair keys with pending todos (at two priorities, one in backoff),
    two todos without a key, and todos of a key that are no longer pending; mail: one key."""
    minutes = [("big", 10, 0), ("big", 5, 0), ("mid", 20, 0), ("mid", 1, 0), ("old", 120, 5)]
    for key, ago, priority in minutes:
        make_todo(
            queue="imports", fair_key=key, priority=priority, created_ago=timedelta(minutes=ago)
        )
    make_todo(queue="imports", fair_key="big", next_retry_in=timedelta(minutes=5))
    make_todo(queue="imports", fair_key="gone", state=State.CLAIMED)
    make_todo(queue="imports", fair_key="gone", state=State.DONE)
    make_todo(queue="imports")
    make_todo(queue="imports", next_retry_in=timedelta(minutes=5))
    make_todo(queue="mail", fair_key="agent:bot/7", created_ago=timedelta(seconds=30))
    make_todo(queue="billing")


def test_fair_shares_count_the_keys_waiting_and_rank_them(tenants: None) -> None:
    """Pending todos only, ready or not, over every priority; the deepest keys first, then the
    keys whose next todo in turn is the oldest; the todos without a key counted apart."""
    found = stats.fair_shares(top=2)
    big, mid = (
        stats.FairKey("big", 3, timedelta(minutes=10)),
        stats.FairKey("mid", 2, timedelta(minutes=20)),
    )
    old = stats.FairKey("old", 1, timedelta(hours=2))
    solo = stats.FairKey("agent:bot/7", 1, timedelta(seconds=30))
    assert found == [
        stats.FairShares("imports", 3, 6, (big, mid), (old, mid)),
        stats.FairShares("mail", 1, 1, (solo,), (solo,)),
    ]
    health = {row.queue: row for row in stats.queue_health()}
    assert found[0].unkeyed(health["imports"]) == 2
    assert found[1].unkeyed(health["mail"]) == 0
    assert found[1].unkeyed(None) == 0
    assert stats.fair_shares(["mail"], top=1)[0].keys == 1
    assert stats.fair_shares(top=0) == [
        stats.FairShares("imports", 3, 6, (), ()),
        stats.FairShares("mail", 1, 1, (), ()),
    ]
    assert stats.fair_shares(["billing"]) == []


def test_fair_shares_read_the_lane_index_alone(tenants: None) -> None:
    """The keys, their depths and their heads come from idx_todos_lane: the counts from the
    index alone, without the rows."""
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_bitmapscan = off")
        cursor.execute("EXPLAIN (FORMAT JSON) " + stats._FAIR_SHARES, {"queues": None, "top": 5})
        plan = cursor.fetchone()[0][0]["Plan"]
    scans = set(_scans(plan))
    assert ("Index Only Scan", "idx_todos_lane") in scans
    assert {index for _node, index in scans} == {"idx_todos_lane"}


def _scans(node: dict[str, Any]) -> Iterator[tuple[str, str | None]]:
    """Each read of the table in the plan below `node`: its type and its index (None for none)."""
    if "Relation Name" in node:
        yield node["Node Type"], node.get("Index Name")
    for child in node.get("Plans", []):
        yield from _scans(child)


# todo_stats


def test_todo_stats_prints_a_table(busy_queues: dict[str, Todo]) -> None:
    """One line per queue under the headings, numbers aligned."""
    out, _ = run("todo_stats")
    lines = out.splitlines()
    assert lines[0].split() == [
        "queue",
        "ready",
        "waiting",
        "blocked",
        "claimed",
        "expired",
        "done",
        "24h",
        "dead",
        "oldest",
        "ready",
    ]
    assert lines[1].split() == ["billing", "0", "0", "0", "0", "0", "1", "2", "-"]
    assert lines[2].split() == ["mail", "2", "1", "1", "1", "1", "0", "0", "30", "min", "0", "s"]


def test_todo_stats_json(busy_queues: dict[str, Todo]) -> None:
    """--json gives every number, the age in seconds, and the database time."""
    out, _ = run("todo_stats", "--json", "--queue", "mail")
    report = json.loads(out)
    assert set(report) == {"at", "queues", "vacuum", "databases"}
    assert report["databases"] == {"default": {"vacuum": report["vacuum"]}}
    assert report["queues"][0].pop("oldest_ready_age") == 1800
    assert report["queues"] == [
        {
            "database": "default",
            "queue": "mail",
            "ready": 2,
            "scheduled": 1,
            "claimed": 1,
            "lease_expired": 1,
            "done_recently": 0,
            "dead": 0,
            "dead_lettered_recently": 0,
            "blocked": 1,
            "tenants": {"keys": 0, "keyed": 0, "unkeyed": 4, "by_depth": [], "by_age": []},
        }
    ]


def test_todo_stats_prints_the_tenants(tenants: None) -> None:
    """Below the table, each queue with fair keys waiting: how many, the deepest, the oldest."""
    out, _ = run("todo_stats")
    assert (
        "Tenants (fair keys with pending todos):\n"
        "imports: 3 keys, 6 pending; 2 pending without a key\n"
        "  deepest: big 3, mid 2, old 1\n"
        "  waiting longest: old 2 h 0 min, mid 20 min 0 s, big 10 min 0 s\n"
        "mail: 1 keys, 1 pending; 0 pending without a key\n"
        "  deepest: agent:bot/7 1\n"
        "  waiting longest: agent:bot/7 30 s\n"
    ) in out
    report = json.loads(run("todo_stats", "--json")[0])
    by_queue = {row["queue"]: row["tenants"] for row in report["queues"]}
    assert by_queue["billing"] == {
        "keys": 0,
        "keyed": 0,
        "unkeyed": 1,
        "by_depth": [],
        "by_age": [],
    }
    assert by_queue["mail"] == {
        "keys": 1,
        "keyed": 1,
        "unkeyed": 0,
        "by_depth": [{"key": "agent:bot/7", "depth": 1, "oldest_age": 30.0}],
        "by_age": [{"key": "agent:bot/7", "depth": 1, "oldest_age": 30.0}],
    }
    assert [key["key"] for key in by_queue["imports"]["by_age"]] == ["old", "mid", "big"]


def test_todo_stats_with_no_todos(db: None) -> None:
    """An empty table says so."""
    assert run("todo_stats")[0].splitlines()[0] == "No todos."


def test_todo_stats_refuses_a_bad_queue_name(db: None) -> None:
    """A malformed --queue is an argument error naming the rule."""
    with pytest.raises(CommandError, match="not a valid queue name"):
        run("todo_stats", "--queue", "two words")


# requeue_todos


def test_requeue_todos_by_id(make_todo: MakeTodo) -> None:
    """Named dead letters go back to pending; the count is printed."""
    dead = [make_todo(state=State.FAILED) for _ in range(2)]
    out, err = run("requeue_todos", *[todo.pk for todo in dead])
    assert (out.strip(), err) == ("Requeued 2 todos.", "")
    assert set(Todo.objects.values_list("state", flat=True)) == {State.PENDING}


def test_requeue_todos_reports_refusals_and_fails(make_todo: MakeTodo) -> None:
    """What was not requeued is printed with the reason, and the command fails."""
    dead = make_todo(state=State.FAILED)
    pending = make_todo()
    out, err = StringIO(), StringIO()
    with pytest.raises(CommandError, match="2 todos were not requeued") as caught:
        call_command("requeue_todos", dead.pk, pending.pk, "td_missing", stdout=out, stderr=err)
    assert caught.value.returncode == 1
    assert out.getvalue().strip() == "Requeued 1 todos."
    assert err.getvalue().splitlines() == [
        "1 not requeued: it does not exist: td_missing",
        f"1 not requeued: it is pending, not dead-lettered: {pending.pk}",
    ]


def test_requeue_todos_all_dead_letters_of_a_queue(make_todo: MakeTodo) -> None:
    """--queue Q --all-dead takes every dead letter of Q, in batches, and no other."""
    mine = [make_todo(state=State.FAILED, queue="mail") for _ in range(5)]
    other = make_todo(state=State.FAILED, queue="billing")
    out, _ = run("requeue_todos", "--queue", "mail", "--all-dead", "--batch-size", "2")
    assert out.strip() == "Requeued 5 todos."
    assert {Todo.objects.get(pk=t.pk).state for t in mine} == {State.PENDING}
    assert Todo.objects.get(pk=other.pk).state == State.FAILED


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "Nothing to requeue"),
        (("td_1", "--queue", "q", "--all-dead"), "not both"),
        (("--all-dead",), "--all-dead needs --queue"),
        (("--queue", "q"), "--queue only goes with --all-dead"),
        (("--queue", "bad name", "--all-dead"), "not a valid queue name"),
        (("--queue", "q", "--all-dead", "--batch-size", "0"), "must be 1 or more"),
        (("--queue", "q", "--all-dead", "--batch-size", "many"), "not a whole number"),
        (("--queue", "q", "--all-dead", "--batch-size", "10001"), "at most 10000"),
        (("x" * 101,), "todo id is 101 characters long"),
    ],
)
def test_requeue_todos_validates_its_arguments(db: None, args: Any, message: str) -> None:
    """Contradictory or malformed arguments are refused with a clear message."""
    with pytest.raises(CommandError, match=message):
        run("requeue_todos", *args)


@pytest.mark.django_db(transaction=True)
def test_requeue_todos_exit_status(spawn: Spawn) -> None:
    """From the shell: status 1 and the reason on stderr when a todo was not requeued."""
    dead = Todo.objects.create(kind="k", state=State.FAILED)
    ok = spawn("manage", "requeue_todos", dead.pk)
    assert ok.communicate(timeout=60)[0].strip() == "Requeued 1 todos."
    assert ok.returncode == 0
    refused = spawn("manage", "requeue_todos", dead.pk)
    _, err = refused.communicate(timeout=60)
    assert refused.returncode == 1
    assert "it is pending, not dead-lettered" in err
